"""Downpour's Python client: submit, follow and export training jobs of a
Downpour cluster (what downpourctl does), and write training data from
NumPy as the daemons read it.

    import downpour
    client = downpour.Client("127.0.0.1:7070")
    job = client.submit("examples/fashion_mnist_mlp.pbtxt")
    client.wait(job)
    weights = client.export(job)  # {"fc1.weight": ndarray [256, 784], ...}

downpour.data.write_records writes tf.Example record files; job_pb2's
JobSpec (downpour.JobSpec) builds a spec in Python.
"""
from . import data
from .client import Client, LogLine, final_line, load_job_spec
from .errors import DownpourError
from .proto.job_pb2 import JobSpec, JobStatus

__version__ = "0.1.0"
__all__ = ["Client", "DownpourError", "JobSpec", "JobStatus", "LogLine", "data", "final_line",
           "load_job_spec"]
