// WorkerRuntime: what a downpour-worker process does with the coordinator's
// task list — run a JobTrainer (worker/trainer.h) on a thread of its own for
// every rank of a job it is given (a SYNC job's lost rank may be given to a
// worker that trains another rank of the job), cancel the trainer of a rank
// that is no longer its task, and, on shutdown, stop every trainer (which tells the coordinator
// the job lost this worker). Progress reports go through the node agent.
// Each run's end is one line in the job's log: finished, its error, or, for
// a run stopped while the job may go on, what happened (its rank went to
// another worker, the job started again, the job left this worker's tasks).
//
// A job's shards are reached through a ShardConnector: RemoteParameterShards
// in the daemon, in-process stores in tests (no sockets).
//
// Thread-safe (the node agent calls OnTasks from its thread; main calls
// StopAll). Owns the trainers, their threads and their shard clients; the
// agent is not owned and must outlive the runtime's trainers (call StopAll
// before the agent goes).
#ifndef DOWNPOUR_WORKER_WORKER_RUNTIME_H_
#define DOWNPOUR_WORKER_WORKER_RUNTIME_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/coordinator.pb.h"
#include "ps/parameter_shard.h"
#include "rpc/node_agent.h"
#include "worker/trainer.h"

namespace downpour {

class WorkerRuntime {
 public:
  // A client of the job's shard at `address` (HOST:PORT from the task).
  using ShardConnector = std::function<std::unique_ptr<ParameterShard>(const std::string& address)>;
  // Runs `free_memory`, which destroys ended runs, and hands what it freed
  // back to the kernel (common/platform/malloc_tuning.h's
  // ReleaseMemoryFreedBy in the daemon).
  using MemoryReleaser = std::function<void(const std::function<void()>& free_memory)>;

  // A run that failed and reported it, while the job stays this worker's
  // task for `failed_run_grace` (the coordinator never acted on the
  // report), runs its rank again from where it had got to. An ended job's
  // metric series (options.metrics: the trainer's, and its shard clients',
  // worker/worker_metrics.h) keep their last values for `metrics_grace`, so
  // a scrape after the end still sees them, and then go. Runs that have
  // returned are destroyed through `release_memory` (if set), with no lock
  // held, so that a long-lived worker does not keep each job's peak.
  WorkerRuntime(TrainerOptions options, ShardConnector connect,
                absl::Duration failed_run_grace = absl::Seconds(10),
                absl::Duration metrics_grace = absl::Minutes(10),
                MemoryReleaser release_memory = nullptr);
  ~WorkerRuntime();

  // The agent reports go through and whose identity trainers use. Tasks that
  // arrive before it is set are ignored (they come again with the next
  // heartbeat).
  void set_agent(NodeAgent* agent) { agent_.store(agent); }

  // Starts a trainer for every new rank of `tasks`, cancels those of ranks
  // no longer listed, and forgets ended jobs whose trainers have returned.
  void OnTasks(const std::vector<Task>& tasks);

  // Shuts every trainer down and joins it; no job starts afterwards. A
  // cancelled earlier run that has not returned yet (its calls to the
  // shards are cancelled, but it may be mid-step) is waited for at most
  // `retiring_grace`; returns false when one was left running — the
  // process may exit without it (std::_Exit), never destroy it.
  bool StopAll(absl::Duration retiring_grace = absl::InfiniteDuration());

  // Jobs whose trainer is running or has not been forgotten yet, sorted.
  std::vector<std::string> Jobs();

 private:
  // A run's job and rank.
  using RunKey = std::pair<std::string, int>;
  struct RunningJob {
    std::string job_id;
    std::vector<std::string> shard_addresses;
    std::vector<std::unique_ptr<ParameterShard>> shards;
    std::unique_ptr<JobTrainer> trainer;
    std::thread thread;
    // Set as the run's thread returns, its model freed (shared with a run
    // that replaces it, which waits for it: Start).
    std::shared_ptr<std::atomic<bool>> done = std::make_shared<std::atomic<bool>>(false);
    absl::Time failed_seen = absl::InfiniteFuture();  // See OnTasks.

    // Stops the run (JobTrainer::Cancel) and ends its calls to the shards
    // at once: a call to a shard that is gone would otherwise hold the run
    // until its deadline (30 s for a push), and with it a worker's exit.
    void Cancel(std::string why = "");
  };

  // A run of `task`. `replaced`: the done flag of the cancelled run it
  // replaces, which may still hold its model's memory; the new run counts
  // against the same shared --device_memory_limit, so it creates its model
  // once that run returned (soon: its calls are cancelled), or after
  // kReplacedRunGrace.
  void Start(const Task& task, std::shared_ptr<const std::atomic<bool>> replaced = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OnTasks' first half: starts, replaces and updates the runs of `tasks`
  // and cancels those of ranks no longer listed; returns the ranks listed.
  std::set<RunKey> StartAndCancel(const std::vector<Task>& tasks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the per-job metric series of an ended job, so a long-lived worker
  // does not accumulate them.
  // REQUIRES: no run of the job is left (they update those series).
  void Forget(const std::string& job_id);
  // Forgets the ended jobs whose metrics grace has passed and that have no
  // run left here.
  void ForgetExpired() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Joins the runs that have returned and are no longer wanted (not in
  // `current`) and hands them over, for destruction outside the lock.
  std::vector<std::unique_ptr<RunningJob>> ReapEnded(const std::set<RunKey>& current)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const TrainerOptions options_;
  const ShardConnector connect_;
  const absl::Duration failed_run_grace_;
  const absl::Duration metrics_grace_;
  const MemoryReleaser release_memory_;
  std::atomic<NodeAgent*> agent_{nullptr};
  absl::Mutex mu_;
  std::map<RunKey, std::unique_ptr<RunningJob>> running_ ABSL_GUARDED_BY(mu_);
  // Cancelled runs of jobs that started again here, until their thread
  // returns (it may be waiting out a call to a shard that is gone: the
  // heartbeat that brought the new start must not wait for it).
  std::vector<std::unique_ptr<RunningJob>> retiring_ ABSL_GUARDED_BY(mu_);
  // Per job: the attempt last started and the runs started in it
  // (TrainerOptions::run_index).
  std::map<std::string, std::pair<int64_t, int64_t>> runs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Ended jobs whose metric series stay until then.
  std::map<std::string, absl::Time> forget_at_ ABSL_GUARDED_BY(mu_);
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_WORKER_RUNTIME_H_
