#include "core/coordinator_state.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/job_validation.h"
#include "core/shard_map.h"

namespace downpour {
namespace {

int64_t ToMillis(absl::Time t) { return absl::ToUnixMillis(t); }

bool InPlacement(const Placement& placement, const std::string& node_id) {
  return std::count(placement.shard_nodes().begin(), placement.shard_nodes().end(), node_id) +
             std::count(placement.worker_nodes().begin(), placement.worker_nodes().end(), node_id) >
         0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorState>> CoordinatorState::Create(
    Options options, std::unique_ptr<JobStore> store) {
  auto state =
      std::unique_ptr<CoordinatorState>(new CoordinatorState(std::move(options), std::move(store)));
  auto jobs = state->store_->LoadJobs();
  if (!jobs.ok()) return jobs.status();
  auto nodes = state->store_->LoadNodes();
  if (!nodes.ok()) return nodes.status();
  absl::MutexLock lock(&state->mu_);
  const absl::Time now = state->options_.now();
  for (NodeInfo& node : *nodes) {
    NodeEntry& entry = state->nodes_[node.id()];
    entry.info = std::move(node);
    entry.last_heartbeat = now;
  }
  for (JobStatus& job : *jobs) {
    state->job_order_.push_back(job.id());
    state->jobs_[job.id()] = std::move(job);
  }
  return state;
}

CoordinatorState::CoordinatorState(Options options, std::unique_ptr<JobStore> store)
    : options_(std::move(options)), store_(std::move(store)) {}

bool CoordinatorState::Alive(const NodeEntry& node) const {
  return node.info.alive() && options_.now() - node.last_heartbeat <= options_.node_timeout;
}

NodeInfo CoordinatorState::Describe(const NodeEntry& node) const {
  NodeInfo info = node.info;
  info.set_alive(Alive(node));
  info.set_last_heartbeat_ms(ToMillis(node.last_heartbeat));
  return info;
}

absl::StatusOr<RegisterNodeResponse> CoordinatorState::RegisterNode(const NodeInfo& node) {
  if (node.id().empty()) return absl::InvalidArgumentError("node id is required");
  if (node.role() != SHARD && node.role() != WORKER) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", node.id(), ": role must be SHARD or WORKER"));
  }
  if (node.address().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("node ", node.id(), ": address is required"));
  }
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node.id());
  if (it != nodes_.end() && it->second.info.incarnation() != node.incarnation()) {
    FailJobsOfNode(node.id(), absl::StrCat("node ", node.id(), " restarted"));
  }
  NodeEntry& entry = nodes_[node.id()];
  entry.info = node;
  entry.info.set_alive(true);
  entry.last_heartbeat = options_.now();
  absl::Status saved = store_->SaveNode(entry.info);
  if (!saved.ok()) return saved;
  SchedulePending();
  RegisterNodeResponse response;
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return response;
}

absl::StatusOr<HeartbeatResponse> CoordinatorState::Heartbeat(const HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  HeartbeatResponse response;
  auto it = nodes_.find(request.node_id());
  if (it == nodes_.end() || it->second.info.incarnation() != request.incarnation()) {
    response.set_reregister(true);
    return response;
  }
  NodeEntry& node = it->second;
  node.last_heartbeat = options_.now();
  if (!node.info.alive()) {
    node.info.set_alive(true);
    (void)store_->SaveNode(node.info);
    SchedulePending();
  }
  for (const std::string& id : job_order_) {
    const JobStatus& job = jobs_[id];
    if (job.state() != RUNNING || !InPlacement(job.placement(), node.info.id())) continue;
    Task* task = response.add_tasks();
    task->set_job_id(job.id());
    *task->mutable_spec() = job.spec();
    *task->mutable_placement() = job.placement();
    for (const std::string& shard : job.placement().shard_nodes()) {
      task->add_shard_addresses(nodes_[shard].info.address());
    }
    const auto& nodes =
        node.info.role() == SHARD ? job.placement().shard_nodes() : job.placement().worker_nodes();
    task->set_rank(std::find(nodes.begin(), nodes.end(), node.info.id()) - nodes.begin());
  }
  return response;
}

std::vector<NodeInfo> CoordinatorState::ListNodes() {
  absl::MutexLock lock(&mu_);
  std::vector<NodeInfo> out;
  for (const auto& [id, node] : nodes_) out.push_back(Describe(node));
  return out;
}

std::string CoordinatorState::NewJobId(const std::string& name) {
  std::string base;
  for (char c : name) {
    base.push_back(std::isalnum(static_cast<uint8_t>(c)) || c == '-' || c == '_' ? c : '-');
  }
  if (base.empty() || !std::isalnum(static_cast<uint8_t>(base[0]))) base = "job" + base;
  base = base.substr(0, 48);
  for (size_t n = jobs_.size() + 1;; ++n) {
    std::string id = absl::StrCat(base, "-", n);
    if (jobs_.count(id) == 0) return id;
  }
}

absl::StatusOr<JobStatus> CoordinatorState::SubmitJob(const JobSpec& submitted,
                                                      const std::string& job_id) {
  JobSpec spec = submitted;
  ApplyJobDefaults(&spec);
  auto params = ValidateJobSpec(spec);
  if (!params.ok()) return params.status();
  absl::MutexLock lock(&mu_);
  std::string id = job_id;
  if (id.empty()) {
    id = NewJobId(spec.name());
  } else {
    absl::Status valid = ValidateJobId(id);
    if (!valid.ok()) return valid;
    if (jobs_.count(id)) {
      return absl::AlreadyExistsError(absl::StrCat("job id \"", id, "\" already exists"));
    }
  }
  JobStatus job;
  job.set_id(id);
  *job.mutable_spec() = spec;
  job.set_state(PENDING);
  job.set_test_accuracy(-1);
  job.set_submit_time_ms(ToMillis(options_.now()));
  absl::Status saved = Commit(&job, /*durable=*/true);
  if (!saved.ok()) return saved;
  jobs_[id] = job;
  job_order_.push_back(id);
  SchedulePending();
  return jobs_[id];
}

std::vector<JobStatus> CoordinatorState::ListJobs() {
  absl::MutexLock lock(&mu_);
  std::vector<JobStatus> out;
  for (const std::string& id : job_order_) out.push_back(jobs_[id]);
  return out;
}

absl::StatusOr<JobStatus> CoordinatorState::GetJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job \"", job_id, "\""));
  return it->second;
}

absl::StatusOr<JobStatus> CoordinatorState::WatchJob(const std::string& job_id,
                                                     int64_t known_version, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job \"", job_id, "\""));
    if (it->second.version() > known_version || absl::Now() >= deadline) return it->second;
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

absl::StatusOr<JobStatus> CoordinatorState::StopJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job \"", job_id, "\""));
  if (!IsTerminal(it->second.state())) {
    FinishJob(&it->second, STOPPED, "stopped by operator");
    SchedulePending();  // Its workers are free now.
  }
  return it->second;
}

absl::StatusOr<ReportProgressResponse> CoordinatorState::ReportProgress(
    const ReportProgressRequest& request) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(request.job_id());
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job \"", request.job_id(), "\""));
  }
  JobStatus& job = it->second;
  ReportProgressResponse response;
  if (job.state() != RUNNING) {
    response.set_job_ended(true);
    return response;
  }
  const int rank = request.rank();
  if (rank < 0 || rank >= job.workers_size() ||
      job.placement().worker_nodes(rank) != request.node_id()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "node ", request.node_id(), " is not worker rank ", rank, " of job ", job.id()));
  }
  if (!request.error().empty()) {
    FinishJob(&job, FAILED,
              absl::StrCat("worker ", rank, " (", request.node_id(), "): ", request.error()));
    SchedulePending();
    response.set_job_ended(true);
    return response;
  }
  WorkerProgress* worker = job.mutable_workers(rank);
  const bool milestone = (request.finished() && !worker->finished()) || request.has_test_accuracy();
  worker->set_step(request.step());
  worker->set_loss(request.loss());
  worker->set_examples_per_sec(request.examples_per_sec());
  worker->set_finished(worker->finished() || request.finished());
  if (request.has_test_accuracy()) job.set_test_accuracy(request.test_accuracy());

  int64_t min_step = INT64_MAX;
  double loss = 0, rate = 0;
  bool all_finished = true;
  for (const WorkerProgress& w : job.workers()) {
    min_step = std::min(min_step, w.step());
    loss += w.loss();
    rate += w.finished() ? 0 : w.examples_per_sec();
    all_finished = all_finished && w.finished();
  }
  job.set_step(min_step);
  job.set_loss(loss / job.workers_size());
  job.set_examples_per_sec(rate);
  if (all_finished && job.test_accuracy() >= 0) {
    FinishJob(&job, SUCCEEDED, "");
    SchedulePending();
    response.set_job_ended(true);
    return response;
  }
  absl::Status saved = Commit(&job, milestone);
  if (!saved.ok()) return saved;
  return response;
}

void CoordinatorState::Tick() {
  absl::MutexLock lock(&mu_);
  DetectDeadNodes();
  SchedulePending();
}

absl::Status CoordinatorState::Commit(JobStatus* job, bool durable) {
  job->set_version(job->version() + 1);
  changed_.SignalAll();
  const absl::Time now = options_.now();
  absl::Time& last = last_persisted_[job->id()];
  if (!durable && now - last < options_.progress_persist_interval) return absl::OkStatus();
  last = now;
  return store_->SaveJob(*job);
}

void CoordinatorState::FinishJob(JobStatus* job, JobState state, const std::string& message) {
  job->set_state(state);
  job->set_message(message);
  job->set_end_time_ms(ToMillis(options_.now()));
  job->set_examples_per_sec(0);
  (void)Commit(job, /*durable=*/true);
}

void CoordinatorState::FailJobsOfNode(const std::string& node_id, const std::string& why) {
  for (auto& [id, job] : jobs_) {
    if (job.state() == RUNNING && InPlacement(job.placement(), node_id)) {
      FinishJob(&job, FAILED, why);
    }
  }
}

void CoordinatorState::DetectDeadNodes() {
  const absl::Time now = options_.now();
  for (auto& [id, node] : nodes_) {
    if (!node.info.alive() || now - node.last_heartbeat <= options_.node_timeout) continue;
    node.info.set_alive(false);
    (void)store_->SaveNode(node.info);
    FailJobsOfNode(id, absl::StrCat(node.info.role() == SHARD ? "shard" : "worker", " node ", id,
                                    " at ", node.info.address(), " stopped heartbeating for ",
                                    absl::FormatDuration(now - node.last_heartbeat)));
  }
}

void CoordinatorState::SchedulePending() {
  std::set<std::string> busy_workers;
  std::map<std::string, int> shard_load;
  for (const auto& [id, job] : jobs_) {
    if (job.state() != RUNNING) continue;
    for (const auto& w : job.placement().worker_nodes()) busy_workers.insert(w);
    for (const auto& s : job.placement().shard_nodes()) ++shard_load[s];
  }
  for (const std::string& id : job_order_) {
    JobStatus& job = jobs_[id];
    if (job.state() != PENDING) continue;
    std::vector<std::string> workers, shards;
    int alive_workers = 0;
    for (const auto& [node_id, node] : nodes_) {
      if (!Alive(node)) continue;
      if (node.info.role() == WORKER) {
        ++alive_workers;
        if (!busy_workers.count(node_id)) workers.push_back(node_id);
      } else {
        shards.push_back(node_id);
      }
    }
    const JobSpec& spec = job.spec();
    if (static_cast<int>(workers.size()) < spec.num_workers() ||
        static_cast<int>(shards.size()) < spec.num_shards()) {
      const std::string waiting = absl::StrCat(
          "waiting for ", spec.num_workers(), " free workers (", workers.size(), " free of ",
          alive_workers, " alive) and ", spec.num_shards(), " shards (", shards.size(), " alive)");
      if (job.message() != waiting) {
        job.set_message(waiting);
        (void)Commit(&job, /*durable=*/false);
      }
      continue;
    }
    auto params = ValidateJobSpec(spec);
    auto placed = params.ok() ? PlacePartitions(*params, spec.num_shards(), spec.partition_bytes())
                              : params.status();
    if (!placed.ok()) {
      FinishJob(&job, FAILED, std::string(placed.status().message()));
      continue;
    }
    std::stable_sort(shards.begin(), shards.end(),
                     [&](const auto& a, const auto& b) { return shard_load[a] < shard_load[b]; });
    Placement* placement = job.mutable_placement();
    placement->Clear();
    for (int i = 0; i < spec.num_shards(); ++i) {
      placement->add_shard_nodes(shards[i]);
      ++shard_load[shards[i]];
    }
    job.clear_workers();
    for (int rank = 0; rank < spec.num_workers(); ++rank) {
      placement->add_worker_nodes(workers[rank]);
      busy_workers.insert(workers[rank]);
      WorkerProgress* progress = job.add_workers();
      progress->set_rank(rank);
      progress->set_node_id(workers[rank]);
    }
    for (auto& p : *placed) *placement->add_partitions() = std::move(p);
    job.set_state(RUNNING);
    job.set_message("");
    job.set_start_time_ms(ToMillis(options_.now()));
    (void)Commit(&job, /*durable=*/true);
  }
}

}  // namespace downpour
