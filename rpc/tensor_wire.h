// Tensor framing for the parameter server's RPCs: a message is a protobuf
// header (PushRequest, PullResponse, ...) plus the partitions' raw bytes
// (common/payload.h), framed as
//
//   [4-byte little-endian header length][serialized header][payload bytes]
//
// and handed to gRPC through SerializationTraits<TensorMessage>: the payload
// pieces become grpc::Slices over their own memory (no copy), and a received
// message's payload refers to the slices it arrived in (no copy). Only the
// small header is serialized.
//
// The RPC method names live here too; the service is registered by hand
// (rpc/shard_service) and called through a raw channel
// (rpc/remote_parameter_shard), because generated proto stubs would serialize
// the bytes into the message.
#ifndef DOWNPOUR_RPC_TENSOR_WIRE_H_
#define DOWNPOUR_RPC_TENSOR_WIRE_H_

#include <string>

#include "common/payload.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/serialization_traits.h"

namespace downpour {

inline constexpr char kPushMethod[] = "/downpour.ParameterServer/Push";
inline constexpr char kPullMethod[] = "/downpour.ParameterServer/Pull";
inline constexpr char kPushPullMethod[] = "/downpour.ParameterServer/PushPull";
inline constexpr char kPushPullStreamMethod[] = "/downpour.ParameterServer/PushPullStream";
// PushPullStream with the tensor bytes in a shared memory segment
// (rpc/shared_segment.h), for a worker on the shard's host.
inline constexpr char kPushPullSharedMemoryStreamMethod[] =
    "/downpour.ParameterServer/PushPullSharedMemoryStream";

struct TensorMessage {
  // The serialized header message.
  std::string header;
  Payload payload;
};

}  // namespace downpour

namespace grpc {

template <>
class SerializationTraits<downpour::TensorMessage, void> {
 public:
  static Status Serialize(const downpour::TensorMessage& message, ByteBuffer* buffer,
                          bool* own_buffer);
  static Status Deserialize(ByteBuffer* buffer, downpour::TensorMessage* message);
};

}  // namespace grpc

#endif  // DOWNPOUR_RPC_TENSOR_WIRE_H_
