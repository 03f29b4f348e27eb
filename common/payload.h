// Payload: tensor bytes travelling beside a request or response header, as
// one or more read-only pieces (e.g. the network buffers a message arrived
// in) whose concatenation is the partitions' bytes in header order. A piece is
// either borrowed (the caller keeps it alive while the payload is used) or
// kept alive by a shared owner.
//
// Copyable (pieces are shared, never copied); thread-compatible.
#ifndef DOWNPOUR_COMMON_PAYLOAD_H_
#define DOWNPOUR_COMMON_PAYLOAD_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace downpour {

class Payload {
 public:
  void Append(const char* data, size_t size) { Append(data, size, nullptr); }
  void Append(const char* data, size_t size, std::shared_ptr<const void> owner);

  size_t size() const { return size_; }
  struct Piece {
    const char* data;
    size_t size;
    std::shared_ptr<const void> owner;  // Null when borrowed.
  };
  const std::vector<Piece>& pieces() const { return pieces_; }

  // Copies bytes [offset, offset + n) to `out`.
  // REQUIRES: offset + n <= size().
  void CopyTo(size_t offset, size_t n, char* out) const;

  // The bytes as one string (a copy; for tests and small payloads).
  std::string ToString() const;

  // Whether another process may write the bytes while they are read (a
  // shared memory segment's): a reader that checks values and then uses
  // them copies them first, so what it checked is what it uses.
  bool shared() const { return shared_; }
  void set_shared(bool shared) { shared_ = shared; }

 private:
  std::vector<Piece> pieces_;
  size_t size_ = 0;
  bool shared_ = false;
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_PAYLOAD_H_
