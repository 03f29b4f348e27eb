// The input of the fuzz targets that parse what arrives over the network
// (rpc/tensor_wire.h's framing): byte 0 says how gRPC cut the message into
// slices (0: one slice; n: slices of n bytes, the last one shorter), the rest
// is the framed message
//
//   [4-byte little-endian header length][serialized header][payload bytes]
//
// so a mutation can move the slice boundaries that the deserializer walks and
// that the payload's pieces keep.
#ifndef DOWNPOUR_FUZZ_RECEIVED_MESSAGE_H_
#define DOWNPOUR_FUZZ_RECEIVED_MESSAGE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "grpcpp/support/byte_buffer.h"
#include "rpc/tensor_wire.h"

namespace downpour {
namespace fuzz {

// The message of a fuzz input as gRPC would hand it to the deserializer.
// REQUIRES: size >= 1.
grpc::ByteBuffer ReceivedMessage(const uint8_t* data, size_t size);

// A fuzz input for `message` as the sender frames it, cut into slices of
// `slice_size` bytes (0: one slice): what the seed corpora hold.
std::string FuzzInput(const TensorMessage& message, uint8_t slice_size);

}  // namespace fuzz
}  // namespace downpour

#endif  // DOWNPOUR_FUZZ_RECEIVED_MESSAGE_H_
