#include "common/payload.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace downpour {

void Payload::Append(const char* data, size_t size, std::shared_ptr<const void> owner) {
  if (size == 0) return;
  pieces_.push_back({data, size, std::move(owner)});
  size_ += size;
}

void Payload::CopyTo(size_t offset, size_t n, char* out) const {
  size_t piece_start = 0;
  for (const Piece& piece : pieces_) {
    if (n == 0) return;
    const size_t piece_end = piece_start + piece.size;
    if (offset < piece_end) {
      const size_t take = std::min(n, piece_end - offset);
      std::memcpy(out, piece.data + (offset - piece_start), take);
      out += take;
      offset += take;
      n -= take;
    }
    piece_start = piece_end;
  }
}

std::string Payload::ToString() const {
  std::string out(size_, '\0');
  CopyTo(0, size_, out.data());
  return out;
}

}  // namespace downpour
