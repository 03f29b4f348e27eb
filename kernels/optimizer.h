// What every backend's optimizer update shares: the kinds (SGD, momentum,
// Adagrad, Adam, each with optional L2 weight decay added to the gradient),
// their resolved hyperparameters, the slots each keeps, and Adam's bias
// corrections computed once, so the CPU reference (kernels/cpu/optimizer.h)
// and the fused CUDA update round alike, and a thread-safe table of those
// corrections by step count (AdamBiasTable). Otherwise plain values and pure
// functions; thread-safe.
#ifndef DOWNPOUR_KERNELS_OPTIMIZER_H_
#define DOWNPOUR_KERNELS_OPTIMIZER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

namespace downpour {

enum class OptimizerKind { kSgd, kMomentum, kAdagrad, kAdam };

class AdamBiasTable;

// Hyperparameters of one update, already resolved (no zero-means-default
// here; see ps/lr_schedule for the defaults of a job spec).
struct OptimizerHyperparams {
  float learning_rate = 0.f;  // At this step (after the schedule).
  float momentum = 0.9f;      // Momentum.
  float beta1 = 0.9f;         // Adam.
  float beta2 = 0.999f;       // Adam.
  float epsilon = 1e-8f;      // Adam and Adagrad.
  float weight_decay = 0.f;   // L2: grad += weight_decay * param.
  // 1-based count of updates including this one (Adam's bias correction).
  int64_t step = 1;
  // Adam: where the bias corrections of beta1, beta2 are kept by step count
  // (a sparse table's rows, each at its own step), or null: computed.
  AdamBiasTable* adam_bias = nullptr;
};

// Number of float slots of `n` elements the optimizer keeps per parameter
// array: SGD 0, momentum 1 (velocity), Adagrad 1 (accumulator), Adam 2 (m, v).
int NumOptimizerSlots(OptimizerKind kind);

// Adam's bias corrections at hp.step (1 at the least), in double once per
// update: step_size = lr / (1 - beta1^t), inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t);
// from hp.adam_bias when it is given (the same bits).
struct AdamCorrections {
  float step_size;
  float inv_sqrt_bc2;
};
AdamCorrections AdamBiasCorrections(const OptimizerHyperparams& hp);

// AdamBiasCorrections for many updates of one beta1 and beta2 with their
// own step counts (a sparse table's rows: each row's t; an update's
// OptimizerHyperparams::adam_bias), the same bits, the powers computed
// once per step count rather than twice per update.
// Thread-safe; filled as far as the largest step asked (up to kSteps, past
// which each call computes its own), so it holds 16 bytes per step count
// reached, at most 1 MiB.
class AdamBiasTable {
 public:
  // The process's table of (beta1, beta2), shared by whoever holds it (the
  // sparse tables of every job with those betas), made when none does.
  static std::shared_ptr<AdamBiasTable> Shared(float beta1, float beta2);

  AdamBiasTable(float beta1, float beta2);
  AdamBiasTable(const AdamBiasTable&) = delete;
  AdamBiasTable& operator=(const AdamBiasTable&) = delete;
  ~AdamBiasTable();

  // hp's corrections (hp.beta1 and hp.beta2 must be the table's).
  AdamCorrections At(const OptimizerHyperparams& hp);

  static constexpr int64_t kSteps = int64_t{1} << 16;

 private:
  struct Powers;
  void FillTo(int64_t step);

  const float beta1_;
  const float beta2_;
  Powers* const powers_;  // kSteps, [0, filled_) written.
  std::atomic<int64_t> filled_{0};
  std::mutex fill_mu_;
};

namespace kernels {

// One tensor of a fused update on a backend's memory: NumOptimizerSlots(kind)
// slots used.
struct TensorUpdate {
  const float* grad = nullptr;
  float* param = nullptr;
  float* slots[2] = {nullptr, nullptr};
  int64_t n = 0;
};

}  // namespace kernels
}  // namespace downpour

#endif  // DOWNPOUR_KERNELS_OPTIMIZER_H_
