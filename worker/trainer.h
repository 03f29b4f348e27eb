// JobTrainer: one worker's part of one job — the training loop of a model
// replica. Each step it pulls the parameters from the job's shards, runs
// forward and backward on its next batch, and pushes the gradients back; it
// reports progress every log_every_steps and, on rank 0, evaluates the final
// model on the held-out set.
//
// The shards are ParameterShard interfaces, so the loop runs the same against
// local stores (tests) and remote shards (the daemon). Run() is blocking and
// runs on its own thread; Cancel() may be called from any thread.
#ifndef DOWNPOUR_WORKER_TRAINER_H_
#define DOWNPOUR_WORKER_TRAINER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "data/dataset.h"
#include "model/model.h"
#include "proto/coordinator.pb.h"
#include "ps/parameter_shard.h"
#include "worker/param_exchange.h"

namespace downpour {

struct TrainerOptions {
  std::string node_id;
  int64_t incarnation = 0;
  // Relative record-file globs of the job are resolved against this.
  std::string data_dir;
  // The exchange's timeouts and tuning (pull_timeout, pull_slice,
  // push_timeout, max_inflight, message_bytes); the trainer fills in the
  // job's own fields (job, rank, identity, wire dtype).
  ExchangeOptions exchange;
  MetricsRegistry* metrics = nullptr;  // Optional, not owned.
  // Where the model replicas compute: one replica per CUDA device listed
  // (ModelOptions::device), or one on the CPU when empty. With several, each
  // step's batch is split across them and their gradients are reduced into
  // the first replica before the push (NCCL between GPUs; see
  // model/replica_set.h).
  std::vector<int> devices;
};

class JobTrainer {
 public:
  // Delivers a progress report to the coordinator. Returns whether the job
  // has ended elsewhere (stopped, or failed on another node), which stops the
  // loop, or the delivery error.
  using Reporter = std::function<absl::StatusOr<bool>(const ReportProgressRequest&)>;

  // `shards[i]` serves shard index i of the task's placement (not owned).
  JobTrainer(Task task, TrainerOptions options, std::vector<ParameterShard*> shards,
             Reporter reporter);

  // Trains to the end, reports the outcome (finished, or the error) and
  // returns it.
  absl::Status Run();
  // The job ended elsewhere: stop without reporting.
  void Cancel() { cancelled_.store(true); }
  // The worker process is exiting: stop, and tell the coordinator the job
  // lost this worker (so it fails now, not after the heartbeat timeout).
  void Shutdown() {
    shutting_down_.store(true);
    cancelled_.store(true);
  }

 private:
  absl::Status Train();
  // Checks the task's placement against the model's parameters and sets up
  // the exchange with the job's shards.
  absl::Status StartExchange(const std::vector<ParamInfo>& params);
  absl::Status PullParameters(Model* model, int64_t min_version, int64_t min_worker_steps);
  // Pushes the step's gradients, or the step as skipped (no gradient).
  absl::Status PushGradients(const Model& model, int64_t step, bool skipped);
  // PushGradients(step, skipped), then PullParameters(min_version,
  // min_worker_steps), in one round trip per message.
  absl::Status PushGradientsAndPull(Model* model, int64_t step, bool skipped, int64_t min_version,
                                    int64_t min_worker_steps);
  absl::StatusOr<std::unique_ptr<data::BatchReader>> OpenTestSet() const;
  absl::StatusOr<double> EvaluateTestSet(Model* model, data::BatchReader* reader);
  // Sends a report; a final one (finished, accuracy, failure) is retried
  // until delivered or the trainer is cancelled. Ordinary progress is best
  // effort.
  void Report(ReportProgressRequest request, bool final);

  const Task task_;
  const TrainerOptions options_;
  const std::vector<ParameterShard*> shards_;
  const Reporter reporter_;
  std::unique_ptr<ParameterExchange> exchange_;  // Set by StartExchange.
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> job_ended_{false};
  std::atomic<bool> shutting_down_{false};
  bool coordinator_reachable_ = true;
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_TRAINER_H_
