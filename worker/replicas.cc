#include "worker/replicas.h"

#include <algorithm>
#include <cstring>
#include <thread>

namespace downpour {

absl::StatusOr<StepResult> TrainStepOnReplicas(const std::vector<std::unique_ptr<Model>>& replicas,
                                               const float* features, const int32_t* labels,
                                               int64_t batch, int64_t step) {
  Model* primary = replicas[0].get();
  const int n = std::min<int64_t>(replicas.size(), batch);
  if (n == 1) {
    return primary->TrainStep(features, labels, batch, step);
  }
  const int64_t feature_size = primary->input_size();
  const auto& params = primary->params();
  for (int r = 1; r < n; ++r) {
    for (const ParamInfo& p : params) {
      std::memcpy(replicas[r]->param(p.id), primary->param(p.id), p.num_elements * sizeof(float));
    }
  }
  // Replica r takes examples [begin[r], begin[r + 1]); each runs on its own
  // thread (its device's work is queued from there). The step number only
  // seeds dropout masks: each replica gets its own stream, so slices do not
  // repeat one another's masks.
  std::vector<int64_t> begin(n + 1);
  for (int r = 0; r <= n; ++r) begin[r] = batch * r / n;
  std::vector<absl::StatusOr<StepResult>> results(n, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 1; r < n; ++r) {
    threads.emplace_back([&, r] {
      results[r] = replicas[r]->TrainStep(features + begin[r] * feature_size, labels + begin[r],
                                          begin[r + 1] - begin[r], step * n + r);
    });
  }
  results[0] = primary->TrainStep(features, labels, begin[1], step * n);
  for (std::thread& t : threads) t.join();
  StepResult total;
  for (int r = 0; r < n; ++r) {
    if (!results[r].ok()) return results[r].status();
    // A replica whose FP16 step overflowed zeroed its gradients; the whole
    // step is skipped so no partial gradient is pushed.
    total.skipped = total.skipped || results[r]->skipped;
  }
  // Each replica's gradient is the mean over its slice: weight by slice size.
  for (const ParamInfo& p : params) {
    float* g = primary->grad(p.id);
    const float w0 = static_cast<float>(begin[1]) / batch;
    for (int64_t i = 0; i < p.num_elements; ++i) g[i] *= w0;
    for (int r = 1; r < n; ++r) {
      const float w = static_cast<float>(begin[r + 1] - begin[r]) / batch;
      const float* gr = replicas[r]->grad(p.id);
      for (int64_t i = 0; i < p.num_elements; ++i) g[i] += w * gr[i];
    }
    if (total.skipped) std::fill(g, g + p.num_elements, 0.f);
  }
  for (int r = 0; r < n; ++r) {
    const double share = static_cast<double>(begin[r + 1] - begin[r]) / batch;
    total.loss += share * results[r]->loss;
    total.correct += results[r]->correct;
  }
  total.loss_scale = results[0]->loss_scale;
  return total;
}

}  // namespace downpour
