#include "fuzz/received_message.h"

#include <algorithm>
#include <random>
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

size_t MutateFramedInput(uint8_t* data, size_t size, size_t max_size, unsigned seed,
                         MutateBytes mutate) {
  std::minstd_rand random(seed);
  const size_t length =
      size < 5 ? 0 : data[1] | data[2] << 8 | data[3] << 16 | static_cast<size_t>(data[4]) << 24;
  if (size < 5 || length > size - 5 || max_size < size || random() % 4 == 0) {
    return mutate(data, size, max_size);
  }
  if (random() % 8 == 0) {
    data[0] = static_cast<uint8_t>(random() % 3 == 0 ? 0 : random());
    return size;
  }
  // The part mutated, with room to grow into max_size; the rest kept aside.
  const bool header = random() % 3 != 0;
  const size_t start = header ? 5 : 5 + length;
  const size_t part = header ? length : size - start;
  const std::vector<uint8_t> rest(data + 5 + length, data + size);  // The payload.
  std::vector<uint8_t> bytes(max_size - (size - part));
  if (bytes.empty()) return mutate(data, size, max_size);
  std::copy(data + start, data + start + part, bytes.begin());
  const size_t mutated = mutate(bytes.data(), part, bytes.size());
  if (!header) {
    std::copy(bytes.begin(), bytes.begin() + mutated, data + start);
    return start + mutated;
  }
  for (int i = 0; i < 4; ++i) data[1 + i] = static_cast<uint8_t>(mutated >> (8 * i));
  std::copy(bytes.begin(), bytes.begin() + mutated, data + 5);
  std::copy(rest.begin(), rest.end(), data + 5 + mutated);
  return 5 + mutated + rest.size();
}

}  // namespace fuzz
}  // namespace downpour
