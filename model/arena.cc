#include "model/arena.h"

#include <algorithm>
#include <utility>

namespace downpour {
namespace model_internal {
namespace {

// Layers whose backward reads their input values (the rest need only the
// output gradient, their own output, or their scratch).
bool BackwardReadsInput(LayerKind kind) {
  switch (kind) {
    case LayerKind::kDense:
    case LayerKind::kConv2d:
    case LayerKind::kBatchNorm:
    case LayerKind::kMaxPool:
    case LayerKind::kEmbedding:
    case LayerKind::kDotInteraction:
      return true;
    default:
      return false;
  }
}

size_t Aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

size_t PlaceBlocks(std::vector<ArenaBlock>& blocks) {
  std::vector<size_t> order(blocks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return blocks[a].bytes > blocks[b].bytes; });
  std::vector<size_t> placed;
  size_t total = 0;
  for (size_t i : order) {
    ArenaBlock& block = blocks[i];
    std::vector<std::pair<size_t, size_t>> taken;  // [offset, end) of overlapping blocks.
    for (size_t j : placed) {
      const ArenaBlock& other = blocks[j];
      if (other.first <= block.last && block.first <= other.last) {
        taken.emplace_back(other.offset, other.offset + other.bytes);
      }
    }
    std::sort(taken.begin(), taken.end());
    size_t offset = 0;
    for (const auto& [start, end] : taken) {
      if (offset + block.bytes <= start) break;
      offset = std::max(offset, end);
    }
    block.offset = offset;
    total = std::max(total, offset + block.bytes);
    placed.push_back(i);
  }
  return total;
}

ArenaPlan PlanArena(const ModelShape& shape, const std::vector<ArenaBuffer>& buffer_list,
                    const std::vector<int>& buffer_of_layer,
                    const std::vector<int64_t>& scratch_need, size_t element_bytes, int64_t batch) {
  const int n = static_cast<int>(shape.layers.size());
  const int buffers = static_cast<int>(buffer_list.size());
  auto backward_time = [n](int layer) { return 2 * n - 1 - layer; };
  // The layer that writes each buffer, and the step's first and last use of
  // its values and of its gradient.
  std::vector<int> producer(buffers, -1);
  for (int i = 0; i < n; ++i) {
    const int out = buffer_of_layer[i];
    if (out > 0 && shape.layers[i].kind != LayerKind::kFlatten) producer[out] = i;
  }
  std::vector<int> value_last(buffers, -1), grad_first(buffers, -1);
  for (int b = 1; b < buffers; ++b) {
    const int p = producer[b];
    value_last[b] = p;
    if (shape.layers[p].kind == LayerKind::kRelu) value_last[b] = backward_time(p);
    grad_first[b] = backward_time(p);
  }
  for (int i = 0; i < n; ++i) {
    if (shape.layers[i].kind == LayerKind::kFlatten) continue;
    for (int input : shape.layers[i].inputs) {
      const int b = input < 0 ? 0 : buffer_of_layer[input];
      if (b <= 0) continue;
      value_last[b] = std::max(value_last[b], i);
      if (BackwardReadsInput(shape.layers[i].kind)) {
        value_last[b] = std::max(value_last[b], backward_time(i));
      }
      grad_first[b] = std::min(grad_first[b], backward_time(i));
    }
  }
  // In-place ReLUs: one block holds the input's and the output's values, for
  // both lifetimes.
  std::vector<ArenaBlock> blocks;
  std::vector<int> value_block(buffers, -1), grad_block(buffers, -1);
  for (int b = 1; b < buffers; ++b) {
    const size_t bytes = Aligned(element_bytes * batch * buffer_list[b].elements);
    const int alias = buffer_list[b].value_alias;
    if (alias > 0) {
      ArenaBlock& shared = blocks[value_block[alias]];
      shared.last = std::max(shared.last, value_last[b]);
      value_block[b] = value_block[alias];
    } else {
      value_block[b] = static_cast<int>(blocks.size());
      blocks.push_back({bytes, producer[b], value_last[b], 0});
    }
    grad_block[b] = static_cast<int>(blocks.size());
    blocks.push_back({bytes, grad_first[b], backward_time(producer[b]), 0});
  }
  // Each layer's measured scratch, live during its own forward or backward
  // (where it mostly fits in room the activations leave free then).
  std::vector<int> scratch_block(scratch_need.size(), -1);
  for (int i = 0; i < static_cast<int>(scratch_need.size()); ++i) {
    if (scratch_need[i] == 0) continue;
    const int time = i % 2 == 0 ? i / 2 : backward_time(i / 2);
    scratch_block[i] = static_cast<int>(blocks.size());
    blocks.push_back({Aligned(static_cast<size_t>(scratch_need[i])), time, time, 0});
  }
  ArenaPlan plan;
  plan.bytes = PlaceBlocks(blocks);
  plan.value_offset.assign(buffers, 0);
  plan.grad_offset.assign(buffers, 0);
  for (int b = 1; b < buffers; ++b) {
    plan.value_offset[b] = blocks[value_block[b]].offset;
    plan.grad_offset[b] = blocks[grad_block[b]].offset;
  }
  plan.scratch_offset.assign(scratch_block.size(), -1);
  for (size_t i = 0; i < scratch_block.size(); ++i) {
    if (scratch_block[i] >= 0) {
      plan.scratch_offset[i] = static_cast<int64_t>(blocks[scratch_block[i]].offset);
    }
  }
  return plan;
}

}  // namespace model_internal
}  // namespace downpour
