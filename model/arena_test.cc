#include "model/arena.h"

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace downpour {
namespace model_internal {
namespace {

bool Overlap(const ArenaBlock& a, const ArenaBlock& b) {
  const bool in_time = a.first <= b.last && b.first <= a.last;
  const bool in_space = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
  return in_time && in_space;
}

TEST(PlaceBlocksTest, BlocksLiveAtOnceNeverShareBytesOthersDo) {
  std::vector<ArenaBlock> blocks = {
      {100, 0, 2, 0},  // Live with the next one.
      {50, 1, 3, 0},
      {100, 4, 5, 0},  // Later: may reuse the first one's bytes.
      {30, 0, 5, 0},   // Live throughout.
  };
  const size_t size = PlaceBlocks(blocks);
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_LE(blocks[i].offset + blocks[i].bytes, size);
    for (size_t j = i + 1; j < blocks.size(); ++j) {
      EXPECT_FALSE(Overlap(blocks[i], blocks[j])) << i << " and " << j;
    }
  }
  // Never more than everything live at the busiest time (100 + 50 + 30).
  EXPECT_LE(size, 180u);
  EXPECT_EQ(blocks[2].offset, blocks[0].offset);
}

// A two-layer MLP: every buffer gets its values and gradient, placed inside
// the arena without two live tensors sharing bytes, and the scratch of a
// layer's call takes room of its own only while that call runs.
TEST(PlanArenaTest, MlpBuffersAndScratchFit) {
  ModelSpec spec;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(R"pb(
                                                              input_shape: 8
                                                              num_classes: 4
                                                              layer { dense { units: 16 } }
                                                              layer { relu {} }
                                                              layer { dense { units: 4 } }
                                                              layer { softmax_cross_entropy {} }
                                                            )pb",
                                                            &spec));
  const ModelShape shape = InferModel(spec).value();
  // Buffer 0 is the input; dense0 -> 1, relu (in place over 1) -> 2,
  // dense1 -> 3, the loss writes none.
  const std::vector<ArenaBuffer> buffers = {{8, -1}, {16, -1}, {16, 1}, {4, -1}};
  const std::vector<int> buffer_of_layer = {1, 2, 3, -1};
  std::vector<int64_t> scratch(2 * shape.layers.size(), 0);
  scratch[0] = 1000;  // dense0's forward.
  const ArenaPlan plan = PlanArena(shape, buffers, buffer_of_layer, scratch, 4, 32);
  EXPECT_EQ(plan.value_offset[2], plan.value_offset[1]);  // The ReLU runs in place.
  ASSERT_EQ(plan.scratch_offset.size(), scratch.size());
  EXPECT_GE(plan.scratch_offset[0], 0);
  EXPECT_EQ(plan.scratch_offset[1], -1);
  for (size_t b = 1; b < buffers.size(); ++b) {
    EXPECT_LE(plan.value_offset[b] + 4 * 32 * buffers[b].elements, plan.bytes);
    EXPECT_LE(plan.grad_offset[b] + 4 * 32 * buffers[b].elements, plan.bytes);
  }
  // dense1's input (the ReLU's output) must survive until dense1's backward,
  // so it cannot share bytes with dense1's output gradient.
  const size_t relu_out = plan.value_offset[2], out_grad = plan.grad_offset[3];
  const size_t relu_bytes = 4 * 32 * 16, out_bytes = 4 * 32 * 4;
  EXPECT_TRUE(relu_out + relu_bytes <= out_grad || out_grad + out_bytes <= relu_out);
}

}  // namespace
}  // namespace model_internal
}  // namespace downpour
