#include "worker/worker_runtime.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "worker/worker_metrics.h"

namespace downpour {

namespace {

// How long a run that replaces a cancelled one waits for it to return
// before it creates its model anyway (WorkerRuntime::Start).
constexpr absl::Duration kReplacedRunGrace = absl::Seconds(10);

}  // namespace

WorkerRuntime::WorkerRuntime(TrainerOptions options, ShardConnector connect,
                             absl::Duration failed_run_grace, absl::Duration metrics_grace,
                             MemoryReleaser release_memory)
    : options_(std::move(options)),
      connect_(std::move(connect)),
      failed_run_grace_(failed_run_grace),
      metrics_grace_(metrics_grace),
      release_memory_(std::move(release_memory)) {}

WorkerRuntime::~WorkerRuntime() { StopAll(); }

void WorkerRuntime::OnTasks(const std::vector<Task>& tasks) {
  if (agent_.load() == nullptr) return;
  std::vector<std::unique_ptr<RunningJob>> ended;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    ended = ReapEnded(StartAndCancel(tasks));
    ForgetExpired();
  }
  if (ended.empty()) return;
  // The runs' models, batches, buffers and shard clients.
  auto destroy = [&ended] { ended.clear(); };
  if (release_memory_) {
    release_memory_(destroy);
  } else {
    destroy();
  }
}

std::set<WorkerRuntime::RunKey> WorkerRuntime::StartAndCancel(const std::vector<Task>& tasks) {
  std::set<RunKey> current;
  std::set<std::string> jobs;
  for (const Task& task : tasks) {
    const RunKey key{task.job_id(), task.rank()};
    current.insert(key);
    jobs.insert(task.job_id());
    auto it = running_.find(key);
    if (it == running_.end()) {
      Start(task);
      continue;
    }
    RunningJob& run = *it->second;
    // The job started again (resumed or recovered) or a shard of the job
    // was replaced: a new run continues the rank (the task is a join).
    // What the old run's end says happened (empty: a run already cancelled,
    // which has its own).
    std::string why;
    if (run.trainer->attempt() != task.attempt()) {
      why = absl::StrCat("the job started again (attempt ", task.attempt(),
                         "); this worker stops its run of attempt ", run.trainer->attempt());
    } else if (!std::equal(run.shard_addresses.begin(), run.shard_addresses.end(),
                           task.shard_addresses().begin(), task.shard_addresses().end())) {
      why = absl::StrCat("the job's shards moved; this worker stops its run and runs rank ",
                         task.rank(), " again against them");
    }
    bool replace = !why.empty() || run.trainer->cancelled();
    Task next = task;
    if (!replace && run.done->load() && !run.trainer->failed() && task.evaluates() &&
        !run.trainer->evaluated()) {
      // Rank 0 was lost after this rank finished: it runs again, from where
      // it got to (never from step 0: SYNC pushes of steps the shards are
      // past are dropped, ASYNC ones would be applied twice), to train what
      // is left and evaluate the job.
      if (!next.has_join()) next.mutable_join()->set_step(run.trainer->steps_completed());
      Log(absl::StrCat("job ", task.job_id(), ": rank ", task.rank(),
                       " evaluates the job now; running it again from step ", next.join().step()));
      replace = true;
    }
    if (!replace && run.done->load() && !run.trainer->failed() && !run.trainer->cancelled() &&
        task.steps() > run.trainer->steps_completed()) {
      // The rank's steps grew as its run finished (it took on a lost rank's
      // share): it runs again, from where it got to, for the rest.
      Log(absl::StrCat("job ", task.job_id(), ": rank ", task.rank(), " has ", task.steps(),
                       " steps now; running it again from step ", run.trainer->steps_completed()));
      if (!next.has_join()) next.mutable_join()->set_step(run.trainer->steps_completed());
      replace = true;
    }
    if (!replace && run.done->load() && run.trainer->failed()) {
      // The run failed and said so, yet the job is still this worker's
      // task: the coordinator did not act on the report (it was down, or
      // took it for another run's). After a while the rank runs again, from
      // where it had got to, rather than stay held by no run.
      if (run.failed_seen == absl::InfiniteFuture()) run.failed_seen = absl::Now();
      replace = absl::Now() - run.failed_seen >= failed_run_grace_;
      if (replace) {
        Log(absl::StrCat("job ", task.job_id(), ": its failed run is still this worker's task; ",
                         "running rank ", task.rank(), " again"));
        if (!next.has_join()) next.mutable_join()->set_step(run.trainer->steps_completed());
      }
    }
    if (replace) {
      // The old run is cancelled and reaped once it returns.
      run.Cancel(std::move(why));
      std::shared_ptr<const std::atomic<bool>> replaced = run.done;
      retiring_.push_back(std::move(it->second));
      running_.erase(it);
      Start(next, std::move(replaced));
      continue;
    }
    run.trainer->SetTakesCheckpoints(task.takes_checkpoints());
    run.trainer->SetEvaluates(task.evaluates());
    if (task.checkpoint_requested_ms() > 0) {
      run.trainer->RequestCheckpoint(task.checkpoint_requested_ms());
    }
    // The rank took on a lost rank's data and steps (ASYNC/SSP).
    if (task.data_size() > 0) {
      run.trainer->UpdateData(std::vector<DataPart>(task.data().begin(), task.data().end()),
                              task.data_step(), task.steps());
    }
  }
  for (auto& [key, run] : running_) {
    if (current.count(key)) continue;
    if (jobs.count(key.first)) {
      // The job goes on here with other ranks: this one went to another
      // worker.
      run->Cancel(absl::StrCat("rank ", key.second,
                               " was handed to another worker; this worker stops its run"));
    } else {
      // A job gone from the list has ended for this worker: whether the job
      // ended or the rank went to another worker, the list does not say.
      run->Cancel();
    }
  }
  return current;
}

void WorkerRuntime::RunningJob::Cancel(std::string why) {
  // The trainer first: the calls' errors are then a cancelled run's.
  trainer->Cancel(std::move(why));
  // Testing: a run that pushes after it lost its rank, as one cut off from
  // the coordinator would, keeps its calls (the shards must refuse them).
  if (trainer->testing_pushes_after_cancel()) return;
  for (const std::unique_ptr<ParameterShard>& shard : shards) shard->CancelCalls();
}

std::vector<std::unique_ptr<WorkerRuntime::RunningJob>> WorkerRuntime::ReapEnded(
    const std::set<RunKey>& current) {
  std::vector<std::unique_ptr<RunningJob>> ended;
  for (auto it = retiring_.begin(); it != retiring_.end();) {
    if ((*it)->done->load()) {
      (*it)->thread.join();
      ended.push_back(std::move(*it));
      it = retiring_.erase(it);
    } else {
      ++it;
    }
  }
  // Forget ended runs whose thread has returned (their job's metric series
  // after the grace, once no run of the job is left).
  for (auto it = running_.begin(); it != running_.end();) {
    if (!current.count(it->first) && it->second->done->load()) {
      it->second->thread.join();
      forget_at_[it->first.first] = absl::Now() + metrics_grace_;
      ended.push_back(std::move(it->second));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  return ended;
}

void WorkerRuntime::ForgetExpired() {
  const absl::Time now = absl::Now();
  for (auto it = forget_at_.begin(); it != forget_at_.end();) {
    const std::string& id = it->first;
    auto of_job = [&](const std::unique_ptr<RunningJob>& job) { return job->job_id == id; };
    const bool running = std::any_of(running_.begin(), running_.end(),
                                     [&](const auto& entry) { return of_job(entry.second); }) ||
                         std::any_of(retiring_.begin(), retiring_.end(), of_job);
    if (now < it->second || running) {
      ++it;
      continue;
    }
    Forget(id);
    it = forget_at_.erase(it);
  }
}

bool WorkerRuntime::StopAll(absl::Duration retiring_grace) {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  for (auto& [key, job] : running_) job->trainer->Shutdown();
  for (auto& [key, job] : running_) job->thread.join();
  running_.clear();
  const absl::Time give_up = absl::Now() + retiring_grace;
  bool all = true;
  for (auto& job : retiring_) {
    while (!job->done->load() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(10));
    if (job->done->load()) {
      job->thread.join();
    } else {
      // Still in a call to a shard that is gone: left to the process's exit.
      job.release();
      all = false;
    }
  }
  retiring_.clear();
  return all;
}

std::vector<std::string> WorkerRuntime::Jobs() {
  absl::MutexLock lock(&mu_);
  std::set<std::string> jobs;
  for (const auto& [key, run] : running_) jobs.insert(key.first);
  return std::vector<std::string>(jobs.begin(), jobs.end());
}

void WorkerRuntime::Forget(const std::string& job_id) {
  if (options_.metrics == nullptr) return;
  // Every series the job's trainer made.
  options_.metrics->RemoveSeries({{"job", job_id}});
}

void WorkerRuntime::Start(const Task& task, std::shared_ptr<const std::atomic<bool>> replaced) {
  auto job = std::make_unique<RunningJob>();
  job->job_id = task.job_id();
  // The job runs here again: its series go on.
  forget_at_.erase(task.job_id());
  std::vector<ParameterShard*> shards;
  for (const std::string& address : task.shard_addresses()) {
    job->shard_addresses.push_back(address);
    std::unique_ptr<ParameterShard> shard = connect_(address);
    if (options_.metrics != nullptr) {
      shard = std::make_unique<MeasuredShardClient>(
          std::move(shard), options_.metrics, task.job_id(), static_cast<int>(job->shards.size()));
    }
    job->shards.push_back(std::move(shard));
    shards.push_back(job->shards.back().get());
  }
  NodeAgent* agent = agent_.load();
  TrainerOptions options = options_;
  options.node_id = agent->self().id();
  options.incarnation = agent->self().incarnation();
  auto& [attempt, runs] = runs_[task.job_id()];
  if (attempt != task.attempt()) {
    attempt = task.attempt();
    runs = 0;
  }
  options.run_index = runs++;
  job->trainer = std::make_unique<JobTrainer>(
      task, options, shards,
      [agent](const ReportProgressRequest& request) { return agent->ReportProgress(request); });
  Log(absl::StrCat("job ", task.job_id(), ": starting as worker rank ", task.rank(), " of ",
                   task.spec().num_workers(), ", ", task.shard_addresses_size(), " shards"));
  RunningJob* raw = job.get();
  const std::string id = task.job_id();
  const RunKey key{id, task.rank()};
  job->thread = std::thread([raw, id, replaced = std::move(replaced)] {
    const absl::Time give_up = absl::Now() + kReplacedRunGrace;
    while (replaced != nullptr && !replaced->load() && !raw->trainer->cancelled() &&
           absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    absl::Status status = raw->trainer->Run();
    // A stopped run's sentence says what happened (it is no failure).
    Log(absl::StrCat("job ", id, ": ",
                     status.ok()                 ? "finished"
                     : absl::IsCancelled(status) ? std::string(status.message())
                                                 : status.ToString()));
    raw->done->store(true);
  });
  if (task.checkpoint_requested_ms() > 0) {
    job->trainer->RequestCheckpoint(task.checkpoint_requested_ms());
  }
  running_[key] = std::move(job);
}

}  // namespace downpour
