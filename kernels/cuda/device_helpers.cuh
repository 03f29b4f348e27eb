// Internal to kernels/cuda: the device helpers every .cu file of the package
// shares (compiled by nvcc only): the launch shape of a grid-stride loop, the
// element conversions that keep the arithmetic between a load and a store in
// fp32, and the 16-byte packed accesses of the element-wise kernels. Pure
// functions; nothing here keeps state.
#ifndef DOWNPOUR_KERNELS_CUDA_DEVICE_HELPERS_CUH_
#define DOWNPOUR_KERNELS_CUDA_DEVICE_HELPERS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace downpour {
namespace kernels {
namespace cuda {
namespace internal {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements (capped; the loops stride).
inline unsigned Blocks(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535 * 8)));
}

#define GRID_STRIDE(i, n)                                                                \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// ---- Element types: every load goes through ToF and every store through
// FromF (round to nearest even), so the arithmetic between is fp32.
__device__ __forceinline__ float ToF(float v) { return v; }
__device__ __forceinline__ float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToF(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T FromF(float v);
template <>
__device__ __forceinline__ float FromF<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromF<__half>(float v) {
  return __float2half_rn(v);
}

// 16-byte accesses for the element-wise kernels: a Pack is kPack<T> elements
// (4 floats or 8 halves), loaded and stored as one 128-bit access. Used where
// n is a multiple of the pack and every pointer is 16-byte aligned (Packed).
template <typename T>
constexpr int kPack = 16 / sizeof(T);

template <typename T>
struct alignas(16) Pack {
  T e[kPack<T>];
};

// The N elements at p (16-byte aligned; N a multiple of kPack<T>) as floats.
template <int N, typename T>
__device__ __forceinline__ void LoadF(const T* p, float (&v)[N]) {
  static_assert(N % kPack<T> == 0, "whole packs only");
  const Pack<T>* packs = reinterpret_cast<const Pack<T>*>(p);
#pragma unroll
  for (int j = 0; j < N / kPack<T>; ++j) {
    const Pack<T> pack = packs[j];
#pragma unroll
    for (int k = 0; k < kPack<T>; ++k) v[j * kPack<T> + k] = ToF(pack.e[k]);
  }
}

template <int N, typename T>
__device__ __forceinline__ void StoreF(T* p, const float (&v)[N]) {
  static_assert(N % kPack<T> == 0, "whole packs only");
  Pack<T>* packs = reinterpret_cast<Pack<T>*>(p);
#pragma unroll
  for (int j = 0; j < N / kPack<T>; ++j) {
    Pack<T> pack;
#pragma unroll
    for (int k = 0; k < kPack<T>; ++k) pack.e[k] = FromF<T>(v[j * kPack<T> + k]);
    packs[j] = pack;
  }
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Whether the 16-byte kernels apply: n is a whole number of packs of `pack`
// elements and every pointer (null ones are unused) is 16-byte aligned.
inline bool Packed(int64_t n, int pack, const void* a, const void* b = nullptr,
                   const void* c = nullptr) {
  return n % pack == 0 && Aligned16(a) && Aligned16(b) && Aligned16(c);
}

}  // namespace internal
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_CUDA_DEVICE_HELPERS_CUH_
