// Reading pushed gradients out of a payload (common/payload.h) where they
// lie, without joining the network's buffers into one: runs of float32
// elements in place when aligned, others (bfloat16, float16, unaligned or
// split elements) decoded through a scratch buffer in bounded chunks. Used
// by the dense partitions (ps/parameter_store.cc) and the sparse tables
// (ps/sparse_store.cc) alike, so both decode the wire the same way.
//
// Pure functions over their arguments (ForEachGradientRun keeps a
// thread_local buffer for the raw bytes of narrow types); thread-safe.
#ifndef DOWNPOUR_PS_GRADIENT_RUNS_H_
#define DOWNPOUR_PS_GRADIENT_RUNS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/payload.h"
#include "common/wire_dtype.h"

namespace downpour {

// Calls fn(grad, start, count) over the gradient of elements [0, n) held in
// bytes [offset, ...) of `payload` as `dtype`: in place where a piece holds
// aligned float32 elements, else through `scratch` in bounded chunks, so a
// payload received as many network buffers is applied without first being
// joined into one.
template <typename Fn>
void ForEachGradientRun(const Payload& payload, size_t offset, int64_t n, WireDtype dtype,
                        std::vector<float>* scratch, Fn fn) {
  // Whole int8 blocks (kInt8Block divides it), so a chunk's bytes start at
  // WireBytes(dtype, start).
  constexpr int64_t kChunk = 16 << 10;
  static_assert(kChunk % kInt8Block == 0);
  // Narrow types are widened through the scratch; so are the bytes of a
  // shared payload (Payload::shared), copied once so that the finite check
  // and the update read the same values.
  if (dtype != WireDtype::kFloat32 || payload.shared()) {
    // The server thread's own, kept across pushes (no allocation a push).
    thread_local std::vector<char> raw;
    for (int64_t start = 0; start < n; start += kChunk) {
      const int64_t count = std::min(kChunk, n - start);
      scratch->resize(count);
      const size_t at = offset + WireBytes(dtype, start);
      if (dtype == WireDtype::kFloat32) {
        payload.CopyTo(at, count * sizeof(float), reinterpret_cast<char*>(scratch->data()));
      } else {
        raw.resize(WireBytes(dtype, count));
        payload.CopyTo(at, raw.size(), raw.data());
        DecodeFloats(dtype, raw.data(), count, scratch->data());
      }
      fn(scratch->data(), start, count);
    }
    return;
  }
  constexpr int64_t kFloatBytes = static_cast<int64_t>(sizeof(float));
  int64_t done = 0;
  size_t piece_start = 0;
  for (const Payload::Piece& piece : payload.pieces()) {
    if (done == n) break;
    const size_t piece_end = piece_start + piece.size;
    const size_t want = offset + done * kFloatBytes;
    if (want >= piece_end) {
      piece_start = piece_end;
      continue;
    }
    const char* at = piece.data + (want - piece_start);
    const int64_t whole = std::min<int64_t>(n - done, (piece_end - want) / kFloatBytes);
    if (whole > 0 && reinterpret_cast<uintptr_t>(at) % alignof(float) == 0) {
      fn(reinterpret_cast<const float*>(at), done, whole);
      done += whole;
      if (done < n && (piece_end - want) % kFloatBytes == 0) {
        piece_start = piece_end;
        continue;
      }
    }
    // Unaligned, or an element split across pieces: copy what remains of
    // this piece (plus the split element) in chunks.
    while (done < n && offset + done * kFloatBytes < piece_end) {
      const int64_t count = std::min<int64_t>(
          {kChunk, n - done,
           static_cast<int64_t>((piece_end - (offset + done * kFloatBytes)) / kFloatBytes) + 1});
      scratch->resize(count);
      payload.CopyTo(offset + done * kFloatBytes, count * kFloatBytes,
                     reinterpret_cast<char*>(scratch->data()));
      fn(scratch->data(), done, count);
      done += count;
    }
    piece_start = piece_end;
  }
}

}  // namespace downpour

#endif  // DOWNPOUR_PS_GRADIENT_RUNS_H_
