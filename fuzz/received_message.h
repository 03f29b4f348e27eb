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

// libFuzzer's mutator of a byte range (LLVMFuzzerMutate): mutates `size`
// bytes at `data` in place into at most `max_size` and returns the new size.
using MutateBytes = size_t (*)(uint8_t* data, size_t size, size_t max_size);

// A structure-aware mutation of a fuzz input of this format, for
// LLVMFuzzerCustomMutator: by `seed`, mutates the header alone, the payload
// alone or the slice byte, keeping the length prefix true (a plain mutation
// that grows or shrinks the header makes the frame mean something else), or
// now and then the whole input as bytes, length prefix included. Returns the
// new size, at most `max_size`.
size_t MutateFramedInput(uint8_t* data, size_t size, size_t max_size, unsigned seed,
                         MutateBytes mutate);

}  // namespace fuzz
}  // namespace downpour

#endif  // DOWNPOUR_FUZZ_RECEIVED_MESSAGE_H_
