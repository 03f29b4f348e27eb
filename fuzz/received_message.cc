#include "fuzz/received_message.h"

#include <algorithm>
#include <vector>

namespace downpour {
namespace fuzz {

grpc::ByteBuffer ReceivedMessage(const uint8_t* data, size_t size) {
  const size_t slice_size = data[0] == 0 ? size : data[0];
  std::vector<grpc::Slice> slices;
  for (size_t at = 1; at < size; at += slice_size) {
    slices.emplace_back(data + at, std::min(slice_size, size - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string FuzzInput(const TensorMessage& message, uint8_t slice_size) {
  grpc::ByteBuffer buffer;
  bool own = false;
  grpc::Status serialized =
      grpc::SerializationTraits<TensorMessage>::Serialize(message, &buffer, &own);
  std::string out(1, static_cast<char>(slice_size));
  std::vector<grpc::Slice> slices;
  if (!serialized.ok() || !buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

}  // namespace fuzz
}  // namespace downpour
