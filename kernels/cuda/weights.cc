#include "kernels/cuda/weights.h"

#include <algorithm>
#include <unordered_map>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/status.h"

namespace downpour {
namespace kernels {
namespace cuda {

// One device block of reduced copies, each at a 256-byte boundary (as the
// workspace's), and the table the cast kernel reads.
struct ReducedWeightCopies {
  void* copies = nullptr;
  int64_t* table = nullptr;  // src_begin[n], dst_begin[n], count[n].
  int num_ranges = 0;
  int64_t max_count = 0;
  size_t bytes = 0;
  const float* src_base = nullptr;
  // Per range start: its copy, and its index in the table and length (host
  // copies of the table's).
  struct Range {
    const void* copy;
    int index;
    int64_t count;
  };
  std::unordered_map<const float*, Range> ranges;
  ReducedWeightCopies() = default;
  ReducedWeightCopies(const ReducedWeightCopies&) = delete;
  ReducedWeightCopies& operator=(const ReducedWeightCopies&) = delete;
  ~ReducedWeightCopies() {
    if (copies != nullptr) cudaFree(copies);
    if (table != nullptr) cudaFree(table);
  }
};

absl::Status RegisterReducedWeights(CudaContext& ctx,
                                    const std::vector<std::pair<const float*, int64_t>>& ranges) {
  if (ctx.compute == ComputePrecision::kFp32) return absl::OkStatus();
  if (ctx.stream != nullptr) CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
  ctx.reduced_weights.reset();
  std::vector<std::pair<const float*, int64_t>> kept;
  for (const auto& r : ranges) {
    if (r.first != nullptr && r.second > 0) kept.push_back(r);
  }
  if (kept.empty()) return absl::OkStatus();
  auto w = std::make_shared<ReducedWeightCopies>();
  // Offsets from the lowest range start: one kernel argument for every range.
  const float* base = kept[0].first;
  for (const auto& r : kept) base = std::min(base, r.first);
  const int n = static_cast<int>(kept.size());
  std::vector<int64_t> table(3 * static_cast<size_t>(n));
  int64_t dst = 0;  // In elements; 128 of 2 bytes keep each copy 256-byte aligned.
  for (int i = 0; i < n; ++i) {
    table[i] = kept[i].first - base;
    table[n + i] = dst;
    table[2 * n + i] = kept[i].second;
    w->max_count = std::max(w->max_count, kept[i].second);
    dst += (kept[i].second + 127) / 128 * 128;
  }
  w->bytes = 2 * static_cast<size_t>(dst) + sizeof(int64_t) * table.size();
  CUDA_RETURN_IF_ERROR(cudaMalloc(&w->copies, 2 * static_cast<size_t>(dst)));
  CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&w->table), sizeof(int64_t) * table.size()));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(w->table, table.data(), sizeof(int64_t) * table.size(), cudaMemcpyHostToDevice));
  for (int i = 0; i < n; ++i) {
    w->ranges[kept[i].first] = {static_cast<char*>(w->copies) + 2 * table[n + i], i,
                                kept[i].second};
  }
  w->num_ranges = n;
  w->src_base = base;
  ctx.reduced_weights = std::move(w);
  return absl::OkStatus();
}

size_t ReducedWeightBytes(const CudaContext& ctx) {
  return ctx.reduced_weights != nullptr ? ctx.reduced_weights->bytes : 0;
}

absl::Status CastReducedWeights(const CudaContext& ctx) {
  const ReducedWeightCopies* w = ctx.reduced_weights.get();
  if (w == nullptr) return absl::OkStatus();
  return FromCuda(
      internal::CastRangesToReduced(ctx.stream, w->num_ranges, w->table, w->table + w->num_ranges,
                                    w->table + 2 * w->num_ranges, w->max_count, w->src_base,
                                    w->copies, ctx.compute == ComputePrecision::kFp16),
      "CastRangesToReduced");
}

absl::Status CastReducedWeight(const CudaContext& ctx, const float* w) {
  const ReducedWeightCopies* r = ctx.reduced_weights.get();
  if (r == nullptr) return absl::OkStatus();
  auto it = r->ranges.find(w);
  if (it == r->ranges.end()) return absl::OkStatus();
  const int i = it->second.index, n = r->num_ranges;
  const int64_t count = it->second.count;
  return FromCuda(internal::CastRangesToReduced(ctx.stream, 1, r->table + i, r->table + n + i,
                                                r->table + 2 * n + i, count, r->src_base, r->copies,
                                                ctx.compute == ComputePrecision::kFp16),
                  "CastRangesToReduced");
}

const void* FindReducedCopy(const CudaContext& ctx, const float* w) {
  if (ctx.reduced_weights == nullptr) return nullptr;
  auto it = ctx.reduced_weights->ranges.find(w);
  return it != ctx.reduced_weights->ranges.end() ? it->second.copy : nullptr;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
