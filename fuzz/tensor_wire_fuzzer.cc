// Fuzzes the tensor frame parser (rpc/tensor_wire.h) as the shard and the
// worker run it on every message off the network: the input (see
// fuzz/received_message.h) is deserialized into a TensorMessage, whose header
// is then parsed as each message that travels in this framing.
//
// Invariants beyond "no crash": a frame is accepted only when its header
// length fits in it; an accepted frame's header and payload are exactly its
// bytes (the payload's pieces, copied in any range, match), and serializing
// the message gives the frame back.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_check.h"
#include "fuzz/received_message.h"
#include "proto/parameter_server.pb.h"
#include "rpc/tensor_wire.h"

namespace downpour {
namespace {

// The headers of the framing's messages, parsed as the shard (requests) and
// the worker (responses) parse them.
void ParseHeaders(const std::string& header) {
  PushRequest push;
  PullRequest pull;
  PushPullRequest push_pull;
  PushPullStreamRequest stream_request;
  PushResponse pushed;
  PullResponse pulled;
  PushPullResponse exchanged;
  PushPullStreamResponse stream_response;
  for (google::protobuf::MessageLite* message :
       std::initializer_list<google::protobuf::MessageLite*>{&push, &pull, &push_pull,
                                                             &stream_request, &pushed, &pulled,
                                                             &exchanged, &stream_response}) {
    message->ParseFromString(header);
  }
}

}  // namespace
}  // namespace downpour

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string frame(reinterpret_cast<const char*>(data) + 1, size - 1);
  grpc::ByteBuffer buffer = downpour::fuzz::ReceivedMessage(data, size);
  downpour::TensorMessage message;
  const grpc::Status status =
      grpc::SerializationTraits<downpour::TensorMessage>::Deserialize(&buffer, &message);
  const uint64_t declared = frame.size() < 4 ? 0
                                             : (uint64_t{static_cast<uint8_t>(frame[0])} |
                                                uint64_t{static_cast<uint8_t>(frame[1])} << 8 |
                                                uint64_t{static_cast<uint8_t>(frame[2])} << 16 |
                                                uint64_t{static_cast<uint8_t>(frame[3])} << 24);
  if (!status.ok()) {
    FUZZ_CHECK(frame.size() < 4 || declared > frame.size() - 4,
               "a valid frame was refused: ", status.error_message());
    FUZZ_CHECK(!status.error_message().empty(), "an error without a message");
    return 0;
  }
  FUZZ_CHECK(frame.size() >= 4 && declared == message.header.size(), "header of ",
             message.header.size(), " bytes, declared ", declared);
  FUZZ_CHECK(4 + message.header.size() + message.payload.size() == frame.size(), "lost bytes");
  FUZZ_CHECK(frame.compare(4, message.header.size(), message.header) == 0, "header differs");
  const std::string payload = frame.substr(4 + message.header.size());
  FUZZ_CHECK(message.payload.ToString() == payload, "payload differs");
  // A window sliding over the payload crosses the pieces' boundaries.
  const size_t window = std::min<size_t>(payload.size(), 7);
  std::string copied(window, '\0');
  for (size_t at = 0; at + window <= payload.size() && window > 0; at += window) {
    message.payload.CopyTo(at, window, copied.data());
    FUZZ_CHECK(payload.compare(at, window, copied) == 0, "CopyTo at ", at, " differs");
  }
  downpour::ParseHeaders(message.header);
  FUZZ_CHECK(downpour::fuzz::FuzzInput(message, 0).substr(1) == frame,
             "serializing the message does not give the frame back");
  return 0;
}
