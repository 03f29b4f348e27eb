#include "ps/parameter_store.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "common/wire_dtype.h"
#include "kernels/cpu/optimizer.h"
#include "ps/gradient_runs.h"
#include "ps/lr_schedule.h"
#include "ps/parameter_arrays.h"
#include "ps/parameter_store_job.h"
#include "ps/rank_ordered_sum.h"
#include "ps/request_dedup.h"
#include "spec/job_validation.h"
#include "spec/limits.h"
#include "spec/memory_needs.h"
#include "spec/params.h"
#include "spec/proto_dtype.h"
#include "spec/shard_map.h"

namespace downpour {

using store_internal::KeyName;
using store_internal::KeyPair;

namespace {

constexpr int64_t kFloatBytes = static_cast<int64_t>(sizeof(float));

RequestKey KeyOf(const PushRequest& request) {
  const RequestId& id = request.request_id();
  return {id.worker_id(), id.incarnation(), id.sequence()};
}

PushResponse DuplicateResponse() {
  PushResponse response;
  response.set_duplicate(true);
  return response;
}

}  // namespace

// The loans of a capture (in the order of its partitions), given back, or
// the copies that replaced them (Detach), when the capture is destroyed;
// and its sparse tables' part, if any. Holds the job, so a job dropped
// meanwhile keeps its partitions and tables until then.
class ParameterStore::CaptureLease : public ShardCapture::Lease {
 public:
  CaptureLease(std::shared_ptr<Job> job, std::vector<std::pair<Partition*, int64_t>> loans,
               std::shared_ptr<SparseCapture> tables)
      : job_(std::move(job)), tables_(std::move(tables)) {
    for (const auto& [partition, generation] : loans) loans_.push_back({partition, generation});
  }

  void TakeTables(ShardSnapshot* info, bool keep) override {
    if (tables_ != nullptr) tables_->Take(info, keep);
  }
  ~CaptureLease() override {
    for (Loan& loan : loans_) {
      Partition& p = *loan.partition;
      ParameterArrays::Arrays freed;  // Freed after the lock is let go.
      absl::MutexLock lock(&p.mu);
      freed = loan.copied ? p.arrays.ReturnCopy(std::move(loan.copy))
                          : p.arrays.GiveBack(loan.generation);
    }
  }

  void Detach(std::vector<PartitionArrays>* partitions) override {
    if (partitions->size() != loans_.size()) return;  // A failed capture.
    for (size_t i = 0; i < loans_.size(); ++i) {
      Loan& loan = loans_[i];
      PartitionArrays& lent = (*partitions)[i];
      Partition& p = *loan.partition;
      {
        absl::MutexLock lock(&p.mu);
        if (!p.arrays.BeginCopy(loan.generation, &loan.copy)) continue;
      }
      ParameterArrays::CopyLent({loan.generation, lent.values, lent.slots}, lent.num_elements,
                                &loan.copy);
      ParameterArrays::Arrays freed;  // Freed after the lock is let go.
      absl::MutexLock lock(&p.mu);
      loan.copied = p.arrays.EndCopy(loan.generation, &loan.copy);
      if (!loan.copied) {
        freed = std::move(loan.copy);
        continue;
      }
      lent.values = loan.copy.values.data();
      for (size_t k = 0; k < lent.slots.size(); ++k) lent.slots[k] = loan.copy.slots[k].data();
    }
  }

 private:
  struct Loan {
    Partition* partition;
    int64_t generation;
    bool copied = false;  // Detach replaced the loan by `copy`.
    ParameterArrays::Arrays copy;
  };

  const std::shared_ptr<Job> job_;
  const std::shared_ptr<SparseCapture> tables_;  // May be null.
  std::vector<Loan> loans_;
};

// One partition of a push and where its bytes start in the payload.
struct ParameterStore::Piece {
  Partition* partition;
  size_t offset;
  WireDtype dtype;
};

ParameterStore::ParameterStore(MemoryBudget* budget, WorkPool* pool)
    : budget_(budget), pool_(pool) {}
ParameterStore::~ParameterStore() = default;

absl::Status ParameterStore::AddJob(const std::string& job_id, const JobSpec& given,
                                    int shard_index,
                                    const std::vector<PartitionPlacement>& partitions,
                                    int64_t attempt, const ShardSnapshot* restore) {
  {
    absl::ReaderMutexLock lock(&mu_);
    if (jobs_.contains(job_id)) return absl::OkStatus();
  }
  if (job_id.empty()) return absl::InvalidArgumentError("job id is empty");
  const std::string where = absl::StrCat("job ", job_id);
  JobSpec spec = given;
  ApplyJobDefaults(&spec);
  absl::StatusOr<std::vector<ParamInfo>> params = ValidateJobSpec(spec);
  if (!params.ok()) return Annotate(params.status(), where);
  RETURN_IF_ERROR(Annotate(CheckPlacement(*params, partitions, spec.num_shards()), where));

  auto job = std::make_shared<Job>();
  job->id = job_id;
  job->optimizer_spec = spec.optimizer();
  job->optimizer = *OptimizerKindOf(spec.optimizer());  // Validated above.
  job->mode = spec.consistency().mode();
  job->num_workers = spec.num_workers();
  job->steps_per_push = std::max(1, spec.consistency().push_every());
  job->sync_quorum = spec.num_workers() - spec.consistency().backup_workers();
  // Validated: INT8 only with SYNC.
  job->int8_pulls = spec.parameter_wire_dtype() == INT8;
  job->shard = shard_index;
  job->attempt = attempt;
  const int num_slots = NumOptimizerSlots(job->optimizer);
  if (budget_ != nullptr) {
    // Values and slots, spare ones for checkpoints, the SYNC sum: what the
    // coordinator admitted the job against.
    const int64_t bytes = ShardPartitionBytes(partitions, shard_index, num_slots, sink_ != nullptr,
                                              job->sync(), job->int8_pulls);
    if (!budget_->TryReserve(bytes)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          where, ": its partitions need ", bytes, " bytes on this shard, more than the ",
          budget_->limit() - budget_->used(), " left of its memory limit of ", budget_->limit(),
          " bytes (raise --memory_limit or add shards)"));
    }
    job->budget = budget_;
    job->reserved_bytes = bytes;
  }
  {
    Job* diverging = job.get();  // Owns the tables: outlives them.
    absl::StatusOr<std::unique_ptr<SparseStore>> sparse = SparseStore::Create(
        job_id, spec, shard_index, budget_,
        [diverging](const std::string& why) { diverging->Diverge(why); }, pool_);
    if (!sparse.ok()) return Annotate(sparse.status(), where);
    job->sparse = *std::move(sparse);
  }

  for (const PartitionPlacement& placement : partitions) {
    if (placement.shard() != shard_index) continue;
    const ParamInfo& param = (*params)[placement.tensor_id()];
    auto partition = std::make_unique<Partition>(placement.tensor_id(), placement.partition(),
                                                 placement.offset(), placement.num_elements());
    job->by_key.emplace(KeyPair(placement.tensor_id(), placement.partition()), partition.get());
    const int64_t n = placement.num_elements();
    {
      absl::MutexLock lock(&partition->mu);
      partition->arrays = ParameterArrays(n, num_slots);
      InitParamRange(param, spec.seed(), placement.offset(), n,
                     partition->arrays.PrepareUpdate().values());
      // Checkpoints will borrow the arrays: the first update after each
      // writes these, mapped now rather than on a push.
      if (sink_) partition->arrays.ReserveSpare();
      if (job->sync()) {
        partition->step_sum = RankOrderedSum(job->num_workers, n);
        partition->previous.assign(n, 0.f);
      }
    }
    job->partitions.push_back(std::move(partition));
  }
  std::sort(job->partitions.begin(), job->partitions.end(),
            [](const std::unique_ptr<Partition>& a, const std::unique_ptr<Partition>& b) {
              return KeyPair(a->tensor_id, a->partition) < KeyPair(b->tensor_id, b->partition);
            });
  {
    absl::MutexLock lock(&job->mu);
    job->worker_steps.assign(job->num_workers, 0);
    job->partial_steps.assign(job->num_workers, {});
    job->presence.assign(job->num_workers, Job::Presence::kCounts);
    job->late_pushes.assign(job->num_workers, 0);
  }
  if (restore != nullptr) RETURN_IF_ERROR(RestoreJob(job.get(), *restore));
  absl::MutexLock lock(&mu_);
  jobs_.emplace(job_id, std::move(job));  // Keeps the first if added concurrently.
  return absl::OkStatus();
}

void ParameterStore::RefuseJob(const std::string& job_id, const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  refused_[job_id] = why;
}

int64_t ParameterStore::RememberedRequests(const std::string& job_id) const {
  auto job = FindJob(job_id);
  if (!job.ok()) return 0;
  absl::MutexLock lock(&(*job)->mu);
  return (*job)->requests.Remembered();
}

int64_t ParameterStore::MemoryBytes(const std::string& job_id) const {
  auto job = FindJob(job_id);
  if (!job.ok()) return 0;
  int64_t bytes = 0;
  for (const std::unique_ptr<Partition>& p : (*job)->partitions) {
    absl::MutexLock lock(&p->mu);
    bytes += p->arrays.MemoryBytes() + p->step_sum.MemoryBytes() +
             static_cast<int64_t>(p->previous.size()) * kFloatBytes + p->published.MemoryBytes();
  }
  if ((*job)->sparse != nullptr) bytes += (*job)->sparse->MemoryBytes();
  return bytes;
}

std::vector<SparseTableStats> ParameterStore::SparseTables(const std::string& job_id) const {
  auto job = FindJob(job_id);
  if (!job.ok() || (*job)->sparse == nullptr) return {};
  return (*job)->sparse->Stats();
}

void ParameterStore::DropJob(const std::string& job_id) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    refused_.erase(job_id);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    job = std::move(it->second);
    jobs_.erase(it);
  }
  absl::MutexLock lock(&job->mu);
  job->dropped = true;
  job->changed.SignalAll();
}

absl::StatusOr<std::shared_ptr<ParameterStore::Job>> ParameterStore::FindJob(
    const std::string& job_id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    auto refused = refused_.find(job_id);
    if (refused != refused_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the shard cannot host job ", job_id, ": ", refused->second.message()));
    }
    return absl::NotFoundError(absl::StrCat("job ", job_id, " is not hosted on this shard (yet)"));
  }
  return it->second;
}

absl::StatusOr<std::vector<ParameterStore::Piece>> ParameterStore::ParsePush(
    const Job& job, const PushRequest& request, const Payload& payload,
    std::vector<SparseStore::PushPiece>* sparse) const {
  const std::string where = absl::StrCat("push to job ", job.id);
  auto invalid = [&where](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", parts...));
  };
  const int rank = request.worker_rank();
  if (rank < 0 || rank >= job.num_workers) {
    return invalid("worker_rank ", rank, " is outside [0, ", job.num_workers, ")");
  }
  if (request.step() < 0) return invalid("step ", request.step(), " is negative");
  // A worker's pushed steps count to step + 1, which the largest int64 lacks.
  if (request.step() == INT64_MAX) return invalid("step ", request.step(), " is out of range");
  if (request.partitions_in_step() < 0) {
    return invalid("partitions_in_step ", request.partitions_in_step(), " is negative");
  }
  // Each partition at most once: no more headers than partitions here.
  if (request.partitions_size() > static_cast<int64_t>(job.partitions.size())) {
    return invalid("partitions has ", request.partitions_size(), " entries; this shard holds ",
                   job.partitions.size(), " of the job");
  }
  std::vector<Piece> pieces;
  pieces.reserve(request.partitions_size());
  absl::flat_hash_set<Partition*> seen;
  int64_t offset = 0;
  for (const PartitionHeader& header : request.partitions()) {
    const std::string name = KeyName(header.key().tensor_id(), header.key().partition());
    auto it = job.by_key.find(KeyPair(header.key().tensor_id(), header.key().partition()));
    if (it == job.by_key.end()) {
      return absl::NotFoundError(absl::StrCat(where, ": no partition ", name, " on this shard"));
    }
    Partition* partition = it->second;
    absl::StatusOr<WireDtype> dtype = WireDtypeOf(header.dtype());
    if (!dtype.ok()) return Annotate(dtype.status(), absl::StrCat(where, ": partition ", name));
    if (header.num_elements() != partition->num_elements) {
      return invalid("partition ", name, " has ", partition->num_elements,
                     " elements, the header says ", header.num_elements());
    }
    if (!seen.insert(partition).second) return invalid("partition ", name, " is listed twice");
    const int64_t size = request.skipped() ? 0 : WireBytes(*dtype, partition->num_elements);
    if (offset + size > static_cast<int64_t>(payload.size())) {
      return invalid("payload has ", payload.size(), " bytes, fewer than the headers describe");
    }
    pieces.push_back({partition, static_cast<size_t>(offset), *dtype});
    offset += size;
  }
  sparse->clear();
  if (request.sparse_size() > 0) {
    if (job.sparse == nullptr) return invalid("sparse rows given; the job has no sparse tables");
    size_t end = 0;
    ASSIGN_OR_RETURN(*sparse, job.sparse->ParsePush(request, payload, offset, &end));
    offset = static_cast<int64_t>(end);
  }
  if (offset != static_cast<int64_t>(payload.size())) {
    return invalid("payload has ", payload.size(), " bytes, the headers describe ", offset);
  }
  return pieces;
}

absl::StatusOr<bool> ParameterStore::Reserve(Job& job, const PushRequest& request) const {
  absl::MutexLock lock(&job.mu);
  RETURN_IF_ERROR(
      job.CheckSender(request.worker_rank(), request.request_id().worker_id(), /*streams=*/true));
  while (true) {
    if (job.dropped) return absl::AbortedError(absl::StrCat("job ", job.id, " was dropped"));
    absl::StatusOr<RequestDedup::Verdict> verdict = job.requests.Reserve(KeyOf(request));
    if (!verdict.ok()) return Annotate(verdict.status(), absl::StrCat("push to job ", job.id));
    switch (*verdict) {
      case RequestDedup::Verdict::kFresh: {
        // The first push of a worker that took over an absent rank: the
        // rank counts again.
        const int rank = request.worker_rank();
        if (job.presence[rank] == Job::Presence::kJoining) {
          job.presence[rank] = Job::Presence::kCounts;
          job.UpdateAnyAbsent();
          Log(absl::StrCat("job ", job.id, ": worker rank ", rank, " joined at step ",
                           request.step()));
        }
        return true;
      }
      case RequestDedup::Verdict::kDuplicate:
        return false;
      case RequestDedup::Verdict::kInFlight:
        // A retry that overtook its original: answer once the outcome is known.
        job.changed.Wait(&job.mu);
        break;
    }
  }
}

void ParameterStore::Settle(Job& job, const PushRequest& request, bool applied) const {
  absl::MutexLock lock(&job.mu);
  job.requests.Settle(KeyOf(request), applied);
  // A worker sends a step's rows in a request of their own (its sparse
  // exchange): where this shard holds partitions of the job, their pushes
  // count the worker's step, not the rows'.
  const bool rows_only = request.partitions_size() == 0 && request.sparse_size() > 0;
  if (applied && !(rows_only && !job.partitions.empty())) {
    const int rank = request.worker_rank();
    int64_t& steps = job.worker_steps[rank];
    const int64_t expected = request.partitions_in_step();
    if (expected == 0) {
      steps = std::max(steps, request.step() + 1);
    } else {
      std::map<int64_t, int64_t>& partial = job.partial_steps[rank];
      int64_t& count = partial[request.step()];
      count += request.partitions_size();
      if (count >= expected) {
        steps = std::max(steps, request.step() + 1);
        partial.erase(partial.begin(), partial.upper_bound(request.step()));
      }
    }
  }
  job.changed.SignalAll();
}

void ParameterStore::ApplyNow(Job& job, const PushRequest& request, const Payload& payload,
                              const Piece& piece, std::vector<float>* scratch) const {
  Partition& p = *piece.partition;
  absl::MutexLock lock(&p.mu);
  const int64_t version = p.version.load(std::memory_order_relaxed);
  if (!request.skipped()) {
    const OptimizerHyperparams hp =
        HyperparamsAt(job.optimizer_spec, job.Progress(version), ++p.updates);
    const ParameterArrays::Update update = p.arrays.PrepareUpdate();
    // Checked a cache-sized block at a time, just before it is applied.
    constexpr int64_t kBlock = 4096;
    bool finite = true;
    int64_t applied = 0;
    ForEachGradientRun(payload, piece.offset, p.num_elements, piece.dtype, scratch,
                       [&](const float* grad, int64_t start, int64_t count) {
                         for (int64_t at = 0; at < count && finite; at += kBlock) {
                           const int64_t n = std::min(kBlock, count - at);
                           finite = kernels::cpu::AllFinite(grad + at, n);
                           if (!finite) break;
                           update.Apply(job.optimizer, hp, grad + at, start + at, n);
                           applied = start + at + n;
                         }
                       });
    // Out of place, what a non-finite block stopped is carried over as is.
    update.Keep(applied, p.num_elements - applied);
    if (!finite) {
      job.Diverge(absl::StrCat("training diverged at step ", request.step(), ": worker rank ",
                               request.worker_rank(), "'s gradient for partition ", p.Name(),
                               " is not finite (found by shard ", job.shard, ")"));
    }
  }
  p.version.store(version + 1, std::memory_order_release);
}

bool ParameterStore::Accumulate(Job& job, const PushRequest& request, const Payload& payload,
                                const Piece& piece, std::vector<float>* scratch) const {
  Partition& p = *piece.partition;
  const int rank = request.worker_rank();
  absl::MutexLock lock(&p.mu);
  const int64_t version = p.version.load(std::memory_order_relaxed);
  // A late push (a straggler the backup workers replaced) or a second one
  // of the same rank for this step is acknowledged and ignored.
  if (request.step() < version) return true;
  if (p.step_sum.arrived(rank)) return false;
  // An absent rank (a worker the coordinator gave up on, still pushing)
  // brings nothing.
  if (job.any_absent.load(std::memory_order_acquire)) {
    absl::MutexLock job_lock(&job.mu);
    if (!job.Counts(rank)) return false;
  }
  // Whoever pushes this step pulled every partition at its version: none
  // needs the version before any more.
  p.previous_version = -1;
  if (request.skipped()) {
    p.step_sum.Skip(rank);
  } else {
    p.step_sum.Add(rank, [&](auto write) {
      ForEachGradientRun(payload, piece.offset, p.num_elements, piece.dtype, scratch, write);
    });
  }
  MaybeCompleteStep(job, p);
  return false;
}

void ParameterStore::MaybeCompleteStep(Job& job, Partition& p) const {
  const int64_t version = p.version.load(std::memory_order_relaxed);
  if (!job.StepComplete(p.step_sum)) return;
  // The step is complete: the mean over the workers that brought a gradient
  // (a skipped step is no contributor), or no update when none did. The
  // values it started from are kept for a worker that takes over a rank
  // lost between its pushes to two partitions (PullRequest.exact_version).
  const int64_t n = p.num_elements;
  std::memcpy(p.previous.data(), p.arrays.values(), n * kFloatBytes);
  p.previous_version = version;
  const int num_contributors = p.step_sum.num_contributors();
  if (num_contributors > 0) {
    float* sum = p.step_sum.Finish();
    const float scale = 1.f / static_cast<float>(num_contributors);
    if (!kernels::cpu::ScaleAndCheckFinite(scale, n, sum)) {
      // Not applied: the values (and any checkpoint of them) stay finite.
      job.Diverge(absl::StrCat("training diverged at step ", version,
                               ": the workers' gradient for partition ", p.Name(),
                               " is not finite (found by shard ", job.shard, ")"));
    } else {
      p.arrays.PrepareUpdate().Apply(
          job.optimizer, HyperparamsAt(job.optimizer_spec, job.Progress(version), ++p.updates), sum,
          0, n);
    }
  }
  p.step_sum.Reset();
  p.version.store(version + 1, std::memory_order_release);
  if (p.capture_at == version + 1) {
    p.capture_at = 0;
    Deliver(job, version + 1, &p, "");
  }
}

std::vector<int64_t> ParameterStore::LatePushes(const std::string& job_id) const {
  absl::StatusOr<std::shared_ptr<Job>> job = FindJob(job_id);
  if (!job.ok()) return {};
  absl::MutexLock lock(&(*job)->mu);
  return (*job)->late_pushes;
}

std::vector<int64_t> ParameterStore::WorkerSteps(const std::string& job_id) const {
  absl::StatusOr<std::shared_ptr<Job>> job = FindJob(job_id);
  if (!job.ok()) return {};
  std::vector<int64_t> steps;
  {
    absl::MutexLock lock(&(*job)->mu);
    steps = (*job)->worker_steps;
  }
  // SYNC: a step every partition here completed is every rank's, pushed or
  // not. A straggler the backup workers replaced skips to the job's step and
  // never pushes the steps it missed: at the last steps, it would otherwise
  // never be counted as done (and its job never end).
  if ((*job)->sync() && !(*job)->partitions.empty()) {
    int64_t completed = INT64_MAX;
    for (const auto& p : (*job)->partitions) {
      completed = std::min(completed, p->version.load(std::memory_order_acquire));
    }
    for (int64_t& s : steps) s = std::max(s, completed);
  }
  return steps;
}

absl::Status ParameterStore::CheckWorkerNode(const std::string& job_id, int rank,
                                             const std::string& node) const {
  absl::StatusOr<std::shared_ptr<Job>> job = FindJob(job_id);
  if (!job.ok()) return absl::OkStatus();
  absl::MutexLock lock(&(*job)->mu);
  return (*job)->CheckSender(rank, node, /*streams=*/false);
}

void ParameterStore::SetWorkers(const std::string& job_id, const std::vector<int>& ranks,
                                const std::vector<std::string>& rank_nodes) {
  std::shared_ptr<Job> job;
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    job = it->second;
  }
  if (job->sparse != nullptr) job->sparse->SetAbsentWorkers(ranks);
  bool newly_absent = false;
  {
    absl::MutexLock lock(&job->mu);
    job->rank_nodes = rank_nodes;
    for (int rank = 0; rank < job->num_workers; ++rank) {
      Job::Presence& presence = job->presence[rank];
      const bool absent = std::count(ranks.begin(), ranks.end(), rank) > 0;
      if (absent && presence != Job::Presence::kAbsent) {
        newly_absent = true;
        presence = Job::Presence::kAbsent;
        Log(absl::StrCat("job ", job_id, ": worker rank ", rank,
                         " absent (lost or finished); steps go on without it"));
      } else if (!absent && presence == Job::Presence::kAbsent) {
        presence = Job::Presence::kJoining;
      }
    }
    job->UpdateAnyAbsent();
    job->changed.SignalAll();
  }
  if (!job->sync()) return;
  // The tables' step may have completed (a capture made ready).
  HandOver(*job);
  if (!newly_absent) return;
  // Steps that waited only for the lost ranks complete now.
  for (const auto& partition : job->partitions) {
    absl::MutexLock lock(&partition->mu);
    MaybeCompleteStep(*job, *partition);
  }
  HandOver(*job);
  absl::MutexLock lock(&job->mu);
  job->changed.SignalAll();
}

void ParameterStore::SetCheckpointSink(CheckpointSink sink) { sink_ = std::move(sink); }

void ParameterStore::BeginCapture(Job& job, int64_t step) const {
  {
    absl::MutexLock lock(&job.capture_mu);
    if (job.capture_step != 0 || step <= job.last_capture_step) return;
    job.capture_step = job.last_capture_step = step;
    job.capture_expected = job.partitions.size() + (job.sparse != nullptr ? 1 : 0);
    job.captured.clear();
    job.loans.clear();
    job.captured_tables = nullptr;
  }
  if (job.capture_expected == 0) Deliver(job, step, nullptr, "");
  if (job.sparse != nullptr) {
    // The tables complete a step as a whole: captured when they reach it
    // (see SparseStore::CaptureAt), beside the partitions. The store owns
    // the tables, and the tables this function: `job` outlives it.
    job.sparse->CaptureAt(
        step, [this, &job, step](absl::StatusOr<std::shared_ptr<SparseCapture>> tables) {
          if (tables.ok()) {
            Deliver(job, step, nullptr, "", *std::move(tables));
          } else {
            Deliver(job, step, nullptr, std::string(tables.status().message()));
          }
        });
  }
  for (const auto& partition : job.partitions) {
    Partition& p = *partition;
    absl::MutexLock lock(&p.mu);
    const int64_t version = p.version.load(std::memory_order_relaxed);
    if (!job.sync() || version == step) {
      Deliver(job, step, &p, "");
    } else if (version < step) {
      p.capture_at = step;
    } else {
      Deliver(job, step, nullptr,
              absl::StrCat("partition ", p.Name(), " is already at version ", version,
                           ", past the checkpoint's step ", step));
    }
  }
  HandOver(job);
}

void ParameterStore::Deliver(Job& job, int64_t step, Partition* p, const std::string& error,
                             std::shared_ptr<SparseCapture> tables) const {
  absl::MutexLock lock(&job.capture_mu);
  if (job.capture_step != step) return;
  ShardSnapshot info;
  info.job_id = job.id;
  info.shard = job.shard;
  info.step = step;
  if (job.attempt > 0) info.attempt = job.attempt;
  info.sync = job.sync();
  if (!error.empty()) {
    // The checkpoint cannot be taken: it fails now (partitions still pending
    // find no capture when they get there), and what was lent to it goes
    // back when the failed capture is dropped.
    info.error = error;
    job.captured.clear();
    job.captured_tables = nullptr;
  } else {
    if (p != nullptr) {
      int64_t generation = 0;
      job.captured.push_back(p->Lend(&generation));
      job.loans.emplace_back(p, generation);
    }
    if (tables != nullptr) job.captured_tables = std::move(tables);
    if (job.captured.size() + (job.captured_tables != nullptr ? 1 : 0) < job.capture_expected) {
      return;
    }
    absl::MutexLock job_lock(&job.mu);
    info.worker_steps = job.worker_steps;
    // In SYNC every worker has pushed `step` steps at version `step` (the
    // push completing it may not have been counted yet).
    if (job.sync()) {
      for (int64_t& steps : info.worker_steps) steps = std::max(steps, step);
    }
    info.requests = job.requests.Export();
  }
  // Sorted, the loans alike (a failed capture has only loans to give back).
  std::vector<size_t> order(job.captured.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&job](size_t a, size_t b) {
    return KeyPair(job.captured[a].tensor_id, job.captured[a].partition) <
           KeyPair(job.captured[b].tensor_id, job.captured[b].partition);
  });
  std::vector<PartitionArrays> partitions;
  std::vector<std::pair<Partition*, int64_t>> loans;
  for (size_t i : order) {
    partitions.push_back(std::move(job.captured[i]));
    loans.push_back(job.loans[i]);
  }
  if (!error.empty()) loans = std::move(job.loans);
  job.ready.emplace_back(std::move(info), std::move(partitions),
                         std::make_unique<CaptureLease>(job.shared_from_this(), std::move(loans),
                                                        std::move(job.captured_tables)));
  job.any_ready.store(true, std::memory_order_release);
  job.captured.clear();
  job.loans.clear();
  job.captured_tables = nullptr;
  job.capture_step = 0;
}

void ParameterStore::HandOver(Job& job) const {
  if (!job.any_ready.load(std::memory_order_acquire)) return;
  absl::MutexLock order(&job.handover_mu);
  std::vector<ShardCapture> ready;
  {
    absl::MutexLock lock(&job.capture_mu);
    ready.swap(job.ready);
    job.any_ready.store(false, std::memory_order_relaxed);
  }
  for (ShardCapture& capture : ready) sink_(std::move(capture));
}

absl::Status ParameterStore::Restore(const std::string& job_id, const ShardSnapshot& snapshot) {
  ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(job_id));
  return RestoreJob(job.get(), snapshot);
}

absl::Status ParameterStore::RestoreJob(Job* job, const ShardSnapshot& snapshot) {
  const std::string where = absl::StrCat("restoring job ", job->id, " from step ", snapshot.step);
  if (snapshot.partitions.size() != job->partitions.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the checkpoint holds ", snapshot.partitions.size(),
                     " partitions of this shard, the job has ", job->partitions.size()));
  }
  const size_t num_slots = static_cast<size_t>(NumOptimizerSlots(job->optimizer));
  for (const PartitionSnapshot& s : snapshot.partitions) {
    auto it = job->by_key.find(KeyPair(s.tensor_id, s.partition));
    const std::string name = KeyName(s.tensor_id, s.partition);
    if (it == job->by_key.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": partition ", name, " is not the job's on this shard"));
    }
    Partition& p = *it->second;
    // No slots: weights without optimizer state (a new job's initial
    // weights), which starts fresh.
    if (s.offset != p.offset || static_cast<int64_t>(s.values.size()) != p.num_elements ||
        (!s.slots.empty() && s.slots.size() != num_slots)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": partition ", name, " does not match the job's (offset ", s.offset,
                       ", ", s.values.size(), " elements, ", s.slots.size(), " optimizer slots)"));
    }
    for (const std::vector<float>& slot : s.slots) {
      if (slot.size() != s.values.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": partition ", name, " has a slot of another size"));
      }
    }
  }
  // The tables first: rows that do not fit the memory limit refuse the
  // restore before a partition changes.
  if (job->sparse != nullptr) {
    RETURN_IF_ERROR(job->sparse->Restore(snapshot));
  } else if (snapshot.has_sparse && !snapshot.sparse_tables.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the checkpoint holds sparse table ",
                                                   snapshot.sparse_tables[0].name,
                                                   "; the job has none"));
  }
  for (const PartitionSnapshot& s : snapshot.partitions) {
    Partition& p = *job->by_key[KeyPair(s.tensor_id, s.partition)];
    absl::MutexLock lock(&p.mu);
    const ParameterArrays::Update update = p.arrays.PrepareUpdate();
    if (s.slots.empty()) update.Keep(0, p.num_elements);  // The slots, out of place.
    std::memcpy(update.values(), s.values.data(), s.values.size() * kFloatBytes);
    for (size_t k = 0; k < s.slots.size(); ++k) {
      std::memcpy(update.slot(static_cast<int>(k)), s.slots[k].data(),
                  s.slots[k].size() * kFloatBytes);
    }
    p.updates = s.updates;
    if (job->sync()) p.step_sum.Reset();
    p.previous_version = -1;
    p.published.Drop();
    p.version.store(s.version, std::memory_order_release);
  }
  absl::MutexLock lock(&job->mu);
  for (size_t rank = 0; rank < job->worker_steps.size() && rank < snapshot.worker_steps.size();
       ++rank) {
    job->worker_steps[rank] = snapshot.worker_steps[rank];
  }
  job->requests.Import(snapshot.requests);
  job->changed.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<PushResponse> ParameterStore::Push(const PushRequest& request,
                                                  const Payload& payload) {
  // The strings a push carries; its lists are bounded by the job (ParsePush).
  RETURN_IF_ERROR(CheckBytes("push job_id", request.job_id(), kMaxJobIdBytes));
  // Remembered per worker for exactly-once, and written one to a line into
  // checkpoints.
  RETURN_IF_ERROR(CheckNodeId("push request_id.worker_id", request.request_id().worker_id()));
  ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(request.job_id()));
  if (job->has_diverged.load(std::memory_order_acquire)) return job->DivergedError();
  if (request.attempt() != 0 && job->attempt != 0 && request.attempt() != job->attempt) {
    return absl::FailedPreconditionError(
        absl::StrCat("push to job ", job->id, " from its start ", request.attempt(),
                     "; this shard hosts its start ", job->attempt));
  }
  if (job->sparse != nullptr) RETURN_IF_ERROR(job->sparse->failure());
  // Everything that does not depend on state is checked first.
  std::vector<SparseStore::PushPiece> sparse;
  ASSIGN_OR_RETURN(std::vector<Piece> pieces, ParsePush(*job, request, payload, &sparse));
  ASSIGN_OR_RETURN(bool fresh, Reserve(*job, request));
  if (!fresh) return DuplicateResponse();
  if (request.checkpoint_step() > 0 && sink_) BeginCapture(*job, request.checkpoint_step());

  if (job->sync()) {
    // Versions only grow, so a step not ahead now is not ahead when applied:
    // checking first means a push is applied whole or not at all.
    for (const Piece& piece : pieces) {
      const int64_t version = piece.partition->version.load(std::memory_order_acquire);
      if (request.step() > version) {
        Settle(*job, request, /*applied=*/false);
        return absl::FailedPreconditionError(
            absl::StrCat("push to job ", job->id, ": step ", request.step(), " of partition ",
                         piece.partition->Name(), " is ahead of its version ", version,
                         "; pull version ", request.step(), " first"));
      }
    }
    if (request.sparse_size() > 0) {
      if (absl::Status ahead = job->sparse->CheckStep(request.step()); !ahead.ok()) {
        Settle(*job, request, /*applied=*/false);
        return ahead;
      }
    }
  }
  bool late = false;
  // First, so that a row the memory budget refuses leaves the partitions
  // as they were.
  if (request.sparse_size() > 0) {
    absl::StatusOr<bool> sparse_late = job->sparse->Push(request, payload, sparse);
    if (!sparse_late.ok()) {
      Settle(*job, request, /*applied=*/false);
      return sparse_late.status();
    }
    late = *sparse_late;
  }
  // The partitions are independent (each under its own mutex): a message's
  // go over the pool's threads and this one, so the push that completes a
  // step applies it in a fraction of the time one thread takes, where the
  // next step's first layers wait for it.
  std::atomic<bool> any_late{late};
  WorkPool::ForEach(pool_, static_cast<int>(pieces.size()), [&](int k) {
    // Each thread's own, kept across pushes (no allocation a push).
    thread_local std::vector<float> scratch;
    if (!job->sync()) {
      ApplyNow(*job, request, payload, pieces[k], &scratch);
    } else if (Accumulate(*job, request, payload, pieces[k], &scratch)) {
      any_late.store(true, std::memory_order_relaxed);
    }
  });
  late = any_late.load();
  if (late) {
    absl::MutexLock lock(&job->mu);
    ++job->late_pushes[request.worker_rank()];
  }
  // A capture this push completed goes to the sink before the push is
  // acknowledged.
  if (job->sync()) HandOver(*job);
  Settle(*job, request, /*applied=*/true);
  return PushResponse();
}

absl::StatusOr<PullResponse> ParameterStore::Pull(const PullRequest& request, absl::Time deadline,
                                                  Payload* payload) {
  RETURN_IF_ERROR(CheckBytes("pull job_id", request.job_id(), kMaxJobIdBytes));
  ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(request.job_id()));
  if (request.dtype() != FLOAT32 && request.dtype() != DTYPE_UNSPECIFIED) {
    return absl::UnimplementedError(absl::StrCat("pull from job ", job->id, ": dtype ",
                                                 DType_Name(request.dtype()),
                                                 " is not supported yet; pull FLOAT32"));
  }
  // Tensors whose partitions go back narrowed (PullRequest.reduced_tensor_ids).
  absl::flat_hash_set<int32_t> reduced;
  WireDtype reduced_dtype = WireDtype::kFloat32;
  if (request.reduced_tensor_ids_size() > 0) {
    absl::StatusOr<WireDtype> narrow = WireDtypeOf(request.reduced_dtype());
    if (!narrow.ok() || *narrow == WireDtype::kFloat32 || *narrow == WireDtype::kInt8) {
      return absl::InvalidArgumentError(absl::StrCat("pull from job ", job->id, ": reduced_dtype ",
                                                     DType_Name(request.reduced_dtype()),
                                                     " is not BFLOAT16 or FLOAT16"));
    }
    if (request.reduced_tensor_ids_size() > static_cast<int64_t>(job->partitions.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pull from job ", job->id, ": reduced_tensor_ids has ", request.reduced_tensor_ids_size(),
          " entries; this shard holds ", job->partitions.size(), " partitions of the job"));
    }
    reduced_dtype = *narrow;
    reduced.insert(request.reduced_tensor_ids().begin(), request.reduced_tensor_ids().end());
  }
  auto dtype_of = [&](const Partition& p) {
    return reduced.contains(p.tensor_id) ? reduced_dtype : WireDtype::kFloat32;
  };
  if (request.exact_version() && !job->sync()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull from job ", job->id, ": an exact version is for a SYNC job"));
  }
  ASSIGN_OR_RETURN(const bool changes, WantsChanges(job->id, job->int8_pulls, request));
  int64_t sparse_bytes = 0;
  SparseStore* const sparse = request.sparse_size() > 0 ? job->sparse.get() : nullptr;
  if (request.sparse_size() > 0) {
    if (sparse == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pull from job ", job->id, ": sparse rows asked for; the job has no sparse tables"));
    }
    ASSIGN_OR_RETURN(sparse_bytes, sparse->PullBytes(request));
  }
  std::vector<Partition*> wanted;
  if (request.keys().empty() && sparse == nullptr) {
    wanted.reserve(job->partitions.size());
    for (const auto& p : job->partitions) wanted.push_back(p.get());
  } else {
    // The answer holds each key's values: a key listed twice (or a list
    // longer than the job's partitions here) would multiply the bytes a
    // small request makes the shard allocate.
    if (request.keys_size() > static_cast<int64_t>(job->partitions.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("pull from job ", job->id, ": keys has ", request.keys_size(),
                       " entries; this shard holds ", job->partitions.size(), " of the job"));
    }
    wanted.reserve(request.keys_size());
    absl::flat_hash_set<const Partition*> seen;
    for (const PartitionKey& key : request.keys()) {
      auto it = job->by_key.find(KeyPair(key.tensor_id(), key.partition()));
      if (it == job->by_key.end()) {
        return absl::NotFoundError(absl::StrCat("pull from job ", job->id, ": no partition ",
                                                KeyName(key.tensor_id(), key.partition()),
                                                " on this shard"));
      }
      if (!seen.insert(it->second).second) {
        return absl::InvalidArgumentError(absl::StrCat("pull from job ", job->id, ": partition ",
                                                       KeyName(key.tensor_id(), key.partition()),
                                                       " is listed twice"));
      }
      wanted.push_back(it->second);
    }
  }

  {
    const absl::Time start = absl::Now();
    const int64_t min_version = request.min_version();
    const int64_t min_steps = request.min_worker_steps();
    // What the pull still waits for, or "" when nothing.
    auto unmet = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu) -> std::string {
      for (const Partition* p : wanted) {
        const int64_t version = p->version.load(std::memory_order_acquire);
        if (version < min_version) {
          return absl::StrCat("partition ", p->Name(), " still at version ", version, " < ",
                              min_version);
        }
      }
      if (sparse != nullptr) {
        std::string tables = sparse->Unmet(min_version);
        if (!tables.empty()) return tables;
      }
      for (int rank = 0; rank < job->num_workers; ++rank) {
        // Nor the caller's own steps: its pushes are in before it pulls.
        if (!job->Counts(rank) || rank == request.worker_rank()) continue;
        if (job->worker_steps[rank] < min_steps) {
          return absl::StrCat("worker ", rank, " has pushed ", job->worker_steps[rank], " steps < ",
                              min_steps);
        }
      }
      return "";
    };
    absl::MutexLock lock(&job->mu);
    while (true) {
      if (job->dropped) return absl::AbortedError(absl::StrCat("job ", job->id, " was dropped"));
      if (job->has_diverged.load()) return job->DivergedErrorLocked();
      if (sparse != nullptr) RETURN_IF_ERROR(sparse->failure());
      const std::string waiting_for = unmet();
      if (waiting_for.empty()) break;
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "job ", job->id, ": ", waiting_for, " after ",
            absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))),
            "; a worker may be down"));
      }
      job->changed.WaitWithDeadline(&job->mu, deadline);
    }
  }

  PullResponse response;
  int64_t total = 0;
  // At most: a change pull's partitions go as int8 or whole in float32.
  for (const Partition* p : wanted) total += WireBytes(dtype_of(*p), p->num_elements);
  total += sparse_bytes;
  // One snapshot buffer, handed to the transport as is (no further copy).
  std::shared_ptr<char> buffer(new char[std::max<int64_t>(total, 1)],
                               std::default_delete<char[]>());
  char* out = buffer.get();
  for (size_t k = 0; k < wanted.size(); ++k) {
    Partition* p = wanted[k];
    PartitionHeader* header = response.add_partitions();
    header->mutable_key()->set_tensor_id(p->tensor_id);
    header->mutable_key()->set_partition(p->partition);
    header->set_num_elements(p->num_elements);
    absl::MutexLock lock(&p->mu);
    if (changes) {
      out = p->published.Write(p->arrays.values(), p->num_elements,
                               p->version.load(std::memory_order_relaxed), HeldOf(request, k),
                               header, out);
      continue;
    }
    const WireDtype dtype = dtype_of(*p);
    header->set_dtype(DTypeOf(dtype));
    const int64_t version = p->version.load(std::memory_order_relaxed);
    const float* values = p->arrays.values();
    if (request.exact_version() && version != request.min_version()) {
      if (p->previous_version != request.min_version()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "pull from job ", job->id, ": partition ", p->Name(), " is at version ", version,
            " and no longer keeps its values of version ", request.min_version()));
      }
      values = p->previous.data();
    }
    header->set_version(request.exact_version() ? request.min_version() : version);
    EncodeFloats(dtype, values, p->num_elements, out);
    out += WireBytes(dtype, p->num_elements);
  }
  if (sparse != nullptr) RETURN_IF_ERROR(sparse->Pull(request, out, &response));
  // Changes are shorter than the room kept for them.
  *payload = Payload();
  payload->Append(buffer.get(), (out - buffer.get()) + sparse_bytes, buffer);
  return response;
}

}  // namespace downpour
