// The fused device optimizers of optimizer.h against the CPU reference
// (kernels/cpu/optimizer.h), within test_util.h's fp32 tolerance. Skips, with
// the reason, where there is no CUDA device.
#include "kernels/cuda/optimizer.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cuda/test_util.h"

namespace downpour {
namespace kernels {
namespace cuda {
namespace test {
namespace {

TEST_F(CudaKernelTest, OptimizersSingleAndFusedMultiTensor) {
  OptimizerHyperparams hp;
  hp.learning_rate = 0.01f;
  hp.weight_decay = 1e-4f;
  hp.step = 3;
  // Sizes straddle the fused kernel's chunk (65536).
  const std::vector<int64_t> sizes = {1, 1000, 70000, 131072 + 5};
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdagrad,
                             OptimizerKind::kAdam}) {
    SCOPED_TRACE(static_cast<int>(kind));
    const int num_slots = NumOptimizerSlots(kind);
    std::vector<std::vector<float>> params, grads, slots0, slots1;
    std::vector<TensorUpdate> updates;
    uint32_t seed = 1;
    for (int64_t n : sizes) {
      params.push_back(Random(n, ++seed));
      grads.push_back(Random(n, ++seed));
      slots0.push_back(Random(n, ++seed, 0.f, 1.f));
      slots1.push_back(Random(n, ++seed, 0.f, 1.f));
      TensorUpdate u;
      u.n = n;
      u.param = Upload(params.back());
      u.grad = Upload(grads.back());
      u.slots[0] = Upload(slots0.back());
      u.slots[1] = Upload(slots1.back());
      updates.push_back(u);
    }
    // The first tensor alone, then all of them fused (the first twice).
    ASSERT_TRUE(cuda::ApplyOptimizer(ctx(), kind, hp, updates[0].grad, updates[0].n,
                                     updates[0].param, updates[0].slots)
                    .ok());
    ASSERT_TRUE(cuda::ApplyOptimizerMultiTensor(ctx(), kind, hp, updates).ok());
    for (size_t t = 0; t < sizes.size(); ++t) {
      float* slots[2] = {slots0[t].data(), slots1[t].data()};
      for (int repeat = 0; repeat < (t == 0 ? 2 : 1); ++repeat) {
        cpu::ApplyOptimizer(kind, hp, grads[t].data(), sizes[t], params[t].data(), slots);
      }
      ExpectClose(params[t], Download(updates[t].param, sizes[t]), "param");
      if (num_slots >= 1) ExpectClose(slots0[t], Download(updates[t].slots[0], sizes[t]), "slot0");
      if (num_slots >= 2) ExpectClose(slots1[t], Download(updates[t].slots[1], sizes[t]), "slot1");
    }
  }
}

}  // namespace
}  // namespace test
}  // namespace cuda
}  // namespace kernels
}  // namespace downpour
