"""Protobuf and gRPC stubs of Downpour's proto/*.proto, generated when the
package is built (python/setup.py): job_pb2 (JobSpec, JobStatus),
coordinator_pb2 (the Coordinator's requests), coordinator_service_pb2_grpc
(its stub), tensor_pb2 and example_pb2 (tensorflow.Example, which the
client itself never imports: a process that also loads TensorFlow's own
would define tensorflow.Example twice)."""
