#include "rpc/tensor_wire.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace grpc {
namespace {

// Releases a payload piece's owner once gRPC is done with the slice.
void ReleaseOwner(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

}  // namespace

Status SerializationTraits<downpour::TensorMessage, void>::Serialize(
    const downpour::TensorMessage& message, ByteBuffer* buffer, bool* own_buffer) {
  const uint32_t length = static_cast<uint32_t>(message.header.size());
  std::vector<Slice> slices;
  slices.reserve(1 + message.payload.pieces().size());
  std::string head(4 + message.header.size(), '\0');
  for (int i = 0; i < 4; ++i) head[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  std::memcpy(head.data() + 4, message.header.data(), message.header.size());
  slices.emplace_back(head);
  for (const downpour::Payload::Piece& piece : message.payload.pieces()) {
    void* data = const_cast<char*>(piece.data);
    if (piece.owner) {
      slices.emplace_back(data, piece.size, &ReleaseOwner,
                          new std::shared_ptr<const void>(piece.owner));
    } else {
      // Borrowed: the caller keeps it alive until the call completes.
      slices.emplace_back(piece.data, piece.size, Slice::STATIC_SLICE);
    }
  }
  ByteBuffer framed(slices.data(), slices.size());
  buffer->Swap(&framed);
  *own_buffer = true;
  return Status::OK;
}

Status SerializationTraits<downpour::TensorMessage, void>::Deserialize(
    ByteBuffer* buffer, downpour::TensorMessage* message) {
  auto slices = std::make_shared<std::vector<Slice>>();
  const Status dumped = buffer->Dump(slices.get());
  buffer->Clear();
  if (!dumped.ok()) return dumped;
  // Walks the slices: the first 4 + length bytes are copied (the header),
  // the rest is referenced.
  size_t slice = 0, at = 0;
  auto take = [&](size_t n, char* out) {
    while (n > 0 && slice < slices->size()) {
      const Slice& s = (*slices)[slice];
      const size_t k = std::min(n, s.size() - at);
      std::memcpy(out, s.begin() + at, k);
      out += k;
      n -= k;
      at += k;
      if (at == s.size()) {
        ++slice;
        at = 0;
      }
    }
    return n == 0;
  };
  unsigned char prefix[4];
  if (!take(4, reinterpret_cast<char*>(prefix))) {
    return Status(StatusCode::INTERNAL, "tensor message shorter than its 4-byte header length");
  }
  const uint32_t length =
      prefix[0] | (prefix[1] << 8) | (prefix[2] << 16) | (static_cast<uint32_t>(prefix[3]) << 24);
  // The length comes from the peer: check it against what arrived before
  // allocating.
  size_t remaining = 0;
  for (size_t i = slice; i < slices->size(); ++i) remaining += (*slices)[i].size();
  remaining -= at;
  if (length > remaining) {
    return Status(StatusCode::INVALID_ARGUMENT, "tensor message header length exceeds the message");
  }
  message->header.resize(length);
  if (!take(length, message->header.data())) {
    return Status(StatusCode::INTERNAL, "tensor message shorter than its header");
  }
  message->payload = downpour::Payload();
  std::shared_ptr<const void> owner = slices;
  for (; slice < slices->size(); ++slice, at = 0) {
    const Slice& s = (*slices)[slice];
    message->payload.Append(reinterpret_cast<const char*>(s.begin()) + at, s.size() - at, owner);
  }
  return Status::OK;
}

}  // namespace grpc
