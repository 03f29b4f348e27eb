// The activation arena of a model: one block of compute memory holding every
// activation's values and gradient, and each layer's scratch, placed by their
// lifetimes in a training step so tensors that are never live at the same
// time share bytes (as a caching allocator would find them, but planned once
// per batch capacity).
//
// The step's schedule numbers forward of layer i as time i and its backward
// as 2 * layers - 1 - i; a value lives from its producer's forward to its
// last reader (a backward that reads its input keeps it longer), a gradient
// from its first contributor's backward to its producer's backward, scratch
// only during its own layer's call. A ReLU that is its input's only reader
// runs in place: one block holds both values, for both lifetimes.
//
// Pure functions; thread-safe.
#ifndef DOWNPOUR_MODEL_ARENA_H_
#define DOWNPOUR_MODEL_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "spec/model_shape.h"

namespace downpour {
namespace model_internal {

// One block: live (inclusive) from time `first` to `last`.
struct ArenaBlock {
  size_t bytes = 0;
  int first = 0, last = 0;
  size_t offset = 0;  // Set by PlaceBlocks.
};

// Offsets for `blocks` such that blocks live at the same time never share
// bytes: largest first, each at the lowest offset that fits among the blocks
// already placed that it meets in time. Returns the arena's size.
size_t PlaceBlocks(std::vector<ArenaBlock>& blocks);

// An activation buffer of the model: elements per example, and, for an
// in-place ReLU, the buffer whose values it overwrites (>= 1), else -1.
// Buffer 0 is the model input, which the arena does not hold.
struct ArenaBuffer {
  int64_t elements = 0;
  int value_alias = -1;
};

// Where everything sits in the arena, in bytes from its start.
struct ArenaPlan {
  size_t bytes = 0;
  std::vector<size_t> value_offset, grad_offset;  // Per buffer; [0] unused.
  std::vector<int64_t> scratch_offset;            // Per scratch slot; -1 for none.
};

// The arena for `batch` examples of `shape`, whose layer i writes buffer
// buffer_of_layer[i] (-1 for the loss; a flatten shares its input's), with
// `element_bytes` per activation element and scratch_need[2i] /
// scratch_need[2i + 1] bytes of scratch for layer i's forward / backward.
ArenaPlan PlanArena(const ModelShape& shape, const std::vector<ArenaBuffer>& buffers,
                    const std::vector<int>& buffer_of_layer,
                    const std::vector<int64_t>& scratch_need, size_t element_bytes, int64_t batch);

}  // namespace model_internal
}  // namespace downpour

#endif  // DOWNPOUR_MODEL_ARENA_H_
