#include "core/parameter_store.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "core/lr_schedule.h"
#include "kernels/optimizer.h"

namespace downpour {
namespace {

constexpr int64_t kFloatBytes = static_cast<int64_t>(sizeof(float));

using KeyPair = std::pair<int32_t, int32_t>;

std::string KeyName(int32_t tensor_id, int32_t partition) {
  return absl::StrCat(tensor_id, "/", partition);
}

bool IsFloat32(DType dtype) { return dtype == FLOAT32 || dtype == DTYPE_UNSPECIFIED; }

uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN.
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float Bf16ToFloat(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToFp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN.
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // Overflow: inf.
  if (abs < 0x38800000u) {  // Subnormal half (or zero): round at the 2^-24 grid.
    float magnitude;
    std::memcpy(&magnitude, &abs, 4);
    // Adding 0.5 moves the value's bits so the low mantissa bits are the
    // half's subnormal mantissa, rounded to nearest even by the FPU.
    const float shifted = magnitude + 0.5f;
    uint32_t bits;
    std::memcpy(&bits, &shifted, 4);
    return static_cast<uint16_t>(sign | (bits - 0x3f000000u));
  }
  const uint32_t mantissa_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mantissa_odd;  // Rebias exponent (-112 << 23) and round.
  return static_cast<uint16_t>(sign | (abs >> 13));
}

float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  uint32_t u;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * (1.f / 16777216.f);  // 2^-24.
    std::memcpy(&u, &magnitude, 4);
    u |= sign;
  } else if (exponent == 31) {
    u = sign | 0x7f800000u | (mantissa << 13);
  } else {
    u = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Calls fn(grad, start, count) over the gradient of elements [0, n) held in
// bytes [offset, ...) of `payload` as `dtype`: in place where a piece holds
// aligned float32 elements, else through `scratch` in bounded chunks, so a
// payload received as many network buffers is applied without first being
// joined into one.
template <typename Fn>
void ForEachGradientRun(const Payload& payload, size_t offset, int64_t n, DType dtype,
                        std::vector<float>* scratch, Fn fn) {
  constexpr int64_t kChunk = 16 << 10;
  const int width = WireBytesPerElement(dtype);
  if (!IsFloat32(dtype)) {
    std::vector<char> raw;
    for (int64_t start = 0; start < n; start += kChunk) {
      const int64_t count = std::min(kChunk, n - start);
      raw.resize(count * width);
      scratch->resize(count);
      payload.CopyTo(offset + start * width, count * width, raw.data());
      DecodeGradients(dtype, raw.data(), count, scratch->data());
      fn(scratch->data(), start, count);
    }
    return;
  }
  int64_t done = 0;
  size_t piece_start = 0;
  for (const Payload::Piece& piece : payload.pieces()) {
    if (done == n) break;
    const size_t piece_end = piece_start + piece.size;
    const size_t want = offset + done * kFloatBytes;
    if (want >= piece_end) {
      piece_start = piece_end;
      continue;
    }
    const char* at = piece.data + (want - piece_start);
    const int64_t whole = std::min<int64_t>(n - done, (piece_end - want) / kFloatBytes);
    if (whole > 0 && reinterpret_cast<uintptr_t>(at) % alignof(float) == 0) {
      fn(reinterpret_cast<const float*>(at), done, whole);
      done += whole;
      if (done < n && (piece_end - want) % kFloatBytes == 0) {
        piece_start = piece_end;
        continue;
      }
    }
    // Unaligned, or an element split across pieces: copy what remains of
    // this piece (plus the split element) in chunks.
    while (done < n && offset + done * kFloatBytes < piece_end) {
      const int64_t count = std::min<int64_t>(
          {kChunk, n - done,
           static_cast<int64_t>((piece_end - (offset + done * kFloatBytes)) / kFloatBytes) + 1});
      scratch->resize(count);
      payload.CopyTo(offset + done * kFloatBytes, count * kFloatBytes,
                     reinterpret_cast<char*>(scratch->data()));
      fn(scratch->data(), done, count);
      done += count;
    }
    piece_start = piece_end;
  }
}

PushResponse DuplicateResponse() {
  PushResponse response;
  response.set_duplicate(true);
  return response;
}

// Exactly-once bookkeeping of one worker process (worker_id) of one job.
struct WorkerRequests {
  int64_t incarnation = 0;
  // Every sequence <= floor counts as applied (pruned from `recent`).
  int64_t floor = std::numeric_limits<int64_t>::min();
  // Sequences above the floor: true once applied, false while in flight.
  std::map<int64_t, bool> recent;
};

}  // namespace

int WireBytesPerElement(DType dtype) {
  switch (dtype) {
    case DTYPE_UNSPECIFIED:
    case FLOAT32:
      return 4;
    case BFLOAT16:
    case FLOAT16:
      return 2;
    default:
      return 0;
  }
}

void EncodeGradients(DType dtype, const float* in, int64_t n, char* out) {
  if (IsFloat32(dtype)) {
    std::memcpy(out, in, n * kFloatBytes);
    return;
  }
  uint16_t* halves = reinterpret_cast<uint16_t*>(out);
  if (dtype == BFLOAT16) {
    for (int64_t i = 0; i < n; ++i) halves[i] = FloatToBf16(in[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) halves[i] = FloatToFp16(in[i]);
  }
}

void DecodeGradients(DType dtype, const char* in, int64_t n, float* out) {
  if (IsFloat32(dtype)) {
    std::memcpy(out, in, n * kFloatBytes);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = dtype == BFLOAT16 ? Bf16ToFloat(h) : Fp16ToFloat(h);
  }
}

void Payload::Append(const char* data, size_t size, std::shared_ptr<const void> owner) {
  if (size == 0) return;
  pieces_.push_back({data, size, std::move(owner)});
  size_ += size;
}

void Payload::CopyTo(size_t offset, size_t n, char* out) const {
  size_t piece_start = 0;
  for (const Piece& piece : pieces_) {
    if (n == 0) return;
    const size_t piece_end = piece_start + piece.size;
    if (offset < piece_end) {
      const size_t take = std::min(n, piece_end - offset);
      std::memcpy(out, piece.data + (offset - piece_start), take);
      out += take;
      offset += take;
      n -= take;
    }
    piece_start = piece_end;
  }
}

std::string Payload::ToString() const {
  std::string out(size_, '\0');
  CopyTo(0, size_, out.data());
  return out;
}

absl::StatusOr<PushResponse> ParameterShard::Push(const PushRequest& request) {
  Payload payload;
  payload.Append(request.payload().data(), request.payload().size());
  return Push(request, payload);
}

absl::StatusOr<PushPullResponse> ParameterShard::PushPull(const PushRequest& push,
                                                          const Payload& push_payload,
                                                          const PullRequest& pull,
                                                          absl::Time deadline,
                                                          Payload* pull_payload) {
  PushPullResponse response;
  ASSIGN_OR_RETURN(*response.mutable_push(), Push(push, push_payload));
  ASSIGN_OR_RETURN(*response.mutable_pull(), Pull(pull, deadline, pull_payload));
  return response;
}

absl::StatusOr<PullResponse> ParameterShard::Pull(const PullRequest& request, absl::Time deadline) {
  Payload payload;
  absl::StatusOr<PullResponse> response = Pull(request, deadline, &payload);
  if (response.ok()) response->set_payload(payload.ToString());
  return response;
}

struct ParameterStore::Partition {
  Partition(int32_t tensor_id_in, int32_t partition_in, int64_t offset_in, int64_t n)
      : tensor_id(tensor_id_in), partition(partition_in), offset(offset_in), num_elements(n) {}

  std::string Name() const { return KeyName(tensor_id, partition); }

  const int32_t tensor_id;
  const int32_t partition;
  const int64_t offset;
  const int64_t num_elements;

  absl::Mutex mu;
  // Number of updates applied. Written under `mu`; read without it by pulls
  // waiting on the job's condition variable.
  std::atomic<int64_t> version{0};
  std::vector<float> values ABSL_GUARDED_BY(mu);
  std::vector<std::vector<float>> slots ABSL_GUARDED_BY(mu);
  // SYNC: sum of the gradients pushed for step == version, and by whom.
  std::vector<float> grad_sum ABSL_GUARDED_BY(mu);
  std::vector<bool> contributed ABSL_GUARDED_BY(mu);
  int num_contributors ABSL_GUARDED_BY(mu) = 0;
};

struct ParameterStore::Job {
  // Immutable after AddJob.
  std::string id;
  OptimizerSpec optimizer_spec;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  ConsistencySpec::Mode mode = ConsistencySpec::SYNC;
  int num_workers = 1;
  // SYNC: contributions that complete a step (num_workers - backup_workers).
  int sync_quorum = 1;
  std::vector<std::unique_ptr<Partition>> partitions;  // Sorted by key.
  absl::flat_hash_map<KeyPair, Partition*> by_key;

  absl::Mutex mu;
  // Signalled whenever a version, a worker's step count, an in-flight request
  // or `dropped` changes.
  absl::CondVar changed;
  bool dropped ABSL_GUARDED_BY(mu) = false;
  // Per worker rank: max pushed step + 1.
  std::vector<int64_t> worker_steps ABSL_GUARDED_BY(mu);
  // Per worker rank: partitions applied so far of steps pushed in several
  // requests (PushRequest.partitions_in_step), by step.
  std::vector<std::map<int64_t, int64_t>> partial_steps ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, WorkerRequests> requests ABSL_GUARDED_BY(mu);
};

ParameterStore::ParameterStore() = default;
ParameterStore::~ParameterStore() = default;

absl::Status ParameterStore::AddJob(const std::string& job_id, const JobSpec& spec, int shard_index,
                                    const std::vector<ParamInfo>& params,
                                    const std::vector<PartitionPlacement>& partitions) {
  {
    absl::ReaderMutexLock lock(&mu_);
    if (jobs_.contains(job_id)) return absl::OkStatus();
  }
  auto invalid = [&job_id](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job_id, ": ", parts...));
  };
  if (job_id.empty()) return absl::InvalidArgumentError("job id is empty");
  if (spec.num_workers() < 1) {
    return invalid("num_workers must be at least 1, got ", spec.num_workers());
  }
  const ConsistencySpec& consistency = spec.consistency();
  if (consistency.mode() != ConsistencySpec::SYNC && consistency.mode() != ConsistencySpec::ASYNC &&
      consistency.mode() != ConsistencySpec::SSP) {
    return invalid("consistency.mode: unknown mode ", static_cast<int>(consistency.mode()));
  }
  if (consistency.backup_workers() < 0 || consistency.backup_workers() >= spec.num_workers()) {
    return invalid("consistency.backup_workers must be in [0, num_workers = ", spec.num_workers(),
                   "), got ", consistency.backup_workers());
  }
  absl::StatusOr<OptimizerKind> kind = OptimizerKindOf(spec.optimizer());
  if (!kind.ok()) return Annotate(kind.status(), absl::StrCat("job ", job_id));

  auto job = std::make_shared<Job>();
  job->id = job_id;
  job->optimizer_spec = spec.optimizer();
  job->optimizer = *kind;
  job->mode = consistency.mode();
  job->num_workers = spec.num_workers();
  job->sync_quorum = spec.num_workers() - consistency.backup_workers();
  const int num_slots = NumOptimizerSlots(job->optimizer);
  const bool sync = job->mode == ConsistencySpec::SYNC;

  for (const PartitionPlacement& placement : partitions) {
    if (placement.shard() != shard_index) continue;
    const std::string name = KeyName(placement.tensor_id(), placement.partition());
    if (placement.tensor_id() < 0 || placement.tensor_id() >= static_cast<int64_t>(params.size())) {
      return invalid("partition ", name, ": tensor_id out of range [0, ", params.size(), ")");
    }
    const ParamInfo& param = params[placement.tensor_id()];
    if (placement.num_elements() <= 0 || placement.offset() < 0 ||
        placement.offset() + placement.num_elements() > param.num_elements) {
      return invalid("partition ", name, ": range [", placement.offset(), ", ",
                     placement.offset() + placement.num_elements(), ") is not inside tensor ",
                     param.name, " of ", param.num_elements, " elements");
    }
    auto partition = std::make_unique<Partition>(placement.tensor_id(), placement.partition(),
                                                 placement.offset(), placement.num_elements());
    if (!job->by_key.emplace(KeyPair(placement.tensor_id(), placement.partition()), partition.get())
             .second) {
      return invalid("partition ", name, " is placed twice");
    }
    const int64_t n = placement.num_elements();
    {
      absl::MutexLock lock(&partition->mu);
      partition->values.resize(n);
      InitParamRange(param, spec.seed(), placement.offset(), n, partition->values.data());
      partition->slots.assign(num_slots, std::vector<float>(n, 0.f));
      if (sync) {
        partition->grad_sum.assign(n, 0.f);
        partition->contributed.assign(job->num_workers, false);
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
  }

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
  int64_t n = 0;
  for (const auto& [worker, requests] : (*job)->requests) n += requests.recent.size();
  return n;
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

std::vector<std::string> ParameterStore::JobIds() const {
  std::vector<std::string> ids;
  {
    absl::ReaderMutexLock lock(&mu_);
    ids.reserve(jobs_.size());
    for (const auto& [id, job] : jobs_) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
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

absl::StatusOr<PushResponse> ParameterStore::Push(const PushRequest& request,
                                                  const Payload& payload) {
  ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(request.job_id()));
  const std::string where = absl::StrCat("push to job ", job->id);
  auto invalid = [&where](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", parts...));
  };

  // Validate everything that does not depend on state first.
  const RequestId& id = request.request_id();
  if (id.worker_id().empty()) return invalid("request_id.worker_id is empty");
  const int rank = request.worker_rank();
  if (rank < 0 || rank >= job->num_workers) {
    return invalid("worker_rank ", rank, " is outside [0, ", job->num_workers, ")");
  }
  if (request.step() < 0) return invalid("step ", request.step(), " is negative");
  if (request.partitions_in_step() < 0) {
    return invalid("partitions_in_step ", request.partitions_in_step(), " is negative");
  }
  struct Piece {
    Partition* partition;
    size_t offset;  // In the payload.
    DType dtype;
  };
  std::vector<Piece> pieces;
  pieces.reserve(request.partitions_size());
  absl::flat_hash_set<Partition*> seen;
  int64_t offset = 0;
  for (const PartitionHeader& header : request.partitions()) {
    const std::string name = KeyName(header.key().tensor_id(), header.key().partition());
    auto it = job->by_key.find(KeyPair(header.key().tensor_id(), header.key().partition()));
    if (it == job->by_key.end()) {
      return absl::NotFoundError(absl::StrCat(where, ": no partition ", name, " on this shard"));
    }
    Partition* partition = it->second;
    const int width = WireBytesPerElement(header.dtype());
    if (width == 0) {
      return absl::UnimplementedError(absl::StrCat(
          where, ": partition ", name, " has unknown dtype ", static_cast<int>(header.dtype())));
    }
    if (header.num_elements() != partition->num_elements) {
      return invalid("partition ", name, " has ", partition->num_elements,
                     " elements, the header says ", header.num_elements());
    }
    if (!seen.insert(partition).second) return invalid("partition ", name, " is listed twice");
    const int64_t size = partition->num_elements * width;
    if (offset + size > static_cast<int64_t>(payload.size())) {
      return invalid("payload has ", payload.size(), " bytes, fewer than the headers describe");
    }
    pieces.push_back({partition, static_cast<size_t>(offset), header.dtype()});
    offset += size;
  }
  if (offset != static_cast<int64_t>(payload.size())) {
    return invalid("payload has ", payload.size(), " bytes, the headers describe ", offset);
  }

  // Exactly once: reserve the request id, or find it applied (or applying).
  {
    absl::MutexLock lock(&job->mu);
    while (true) {
      if (job->dropped) return absl::AbortedError(absl::StrCat("job ", job->id, " was dropped"));
      auto [it, fresh] = job->requests.try_emplace(id.worker_id());
      WorkerRequests& worker = it->second;
      if (fresh || id.incarnation() > worker.incarnation) {
        worker = WorkerRequests();
        worker.incarnation = id.incarnation();
      } else if (id.incarnation() < worker.incarnation) {
        return absl::FailedPreconditionError(
            absl::StrCat(where, ": worker ", id.worker_id(), " incarnation ", id.incarnation(),
                         " was superseded by incarnation ", worker.incarnation));
      }
      if (id.sequence() <= worker.floor) return DuplicateResponse();  // Long applied.
      auto [seq, inserted] = worker.recent.try_emplace(id.sequence(), false);
      if (!inserted) {
        if (seq->second) return DuplicateResponse();
        // The same request is being applied by another thread (a retry that
        // overtook its original): answer once we know the outcome.
        job->changed.Wait(&job->mu);
        continue;
      }
      // Prune the oldest applied sequences; in-flight ones stay.
      while (static_cast<int>(worker.recent.size()) > kDedupWindow &&
             worker.recent.begin()->second) {
        worker.floor = worker.recent.begin()->first;
        worker.recent.erase(worker.recent.begin());
      }
      break;
    }
  }
  // Settles the reservation: marks it applied, or forgets it so a retry runs.
  auto settle = [&](bool applied) {
    absl::MutexLock lock(&job->mu);
    auto it = job->requests.find(id.worker_id());
    if (it != job->requests.end() && it->second.incarnation == id.incarnation()) {
      auto seq = it->second.recent.find(id.sequence());
      if (seq != it->second.recent.end()) {
        if (applied) {
          seq->second = true;
        } else {
          it->second.recent.erase(seq);
        }
      }
    }
    if (applied) {
      int64_t& steps = job->worker_steps[rank];
      const int64_t expected = request.partitions_in_step();
      if (expected == 0) {
        steps = std::max(steps, request.step() + 1);
      } else {
        std::map<int64_t, int64_t>& partial = job->partial_steps[rank];
        int64_t& count = partial[request.step()];
        count += request.partitions_size();
        if (count >= expected) {
          steps = std::max(steps, request.step() + 1);
          partial.erase(partial.begin(), partial.upper_bound(request.step()));
        }
      }
    }
    job->changed.SignalAll();
  };

  const int64_t step = request.step();
  const bool sync = job->mode == ConsistencySpec::SYNC;
  if (sync) {
    // Versions only grow, so a step not ahead now is not ahead when applied:
    // checking first means a push is applied whole or not at all.
    for (const Piece& piece : pieces) {
      const int64_t version = piece.partition->version.load(std::memory_order_acquire);
      if (step > version) {
        settle(false);
        return absl::FailedPreconditionError(
            absl::StrCat(where, ": step ", step, " of partition ", piece.partition->Name(),
                         " is ahead of its version ", version, "; pull version ", step, " first"));
      }
    }
  }

  std::vector<float> scratch;
  for (const Piece& piece : pieces) {
    Partition& p = *piece.partition;
    const int64_t n = p.num_elements;
    absl::MutexLock lock(&p.mu);
    const int64_t version = p.version.load(std::memory_order_relaxed);
    float* values = p.values.data();
    std::vector<float>* slot_arrays = p.slots.data();
    const size_t num_slots = p.slots.size();
    if (!sync) {
      const OptimizerHyperparams hp = HyperparamsAt(job->optimizer_spec, version);
      ForEachGradientRun(payload, piece.offset, n, piece.dtype, &scratch,
                         [&](const float* grad, int64_t start, int64_t count) {
                           float* slots[2] = {nullptr, nullptr};
                           for (size_t i = 0; i < num_slots; ++i) {
                             slots[i] = slot_arrays[i].data() + start;
                           }
                           ApplyOptimizer(job->optimizer, hp, grad, count, values + start, slots);
                         });
      p.version.store(version + 1, std::memory_order_release);
      continue;
    }
    // SYNC: a late push (a straggler the backup workers replaced) or a
    // second contribution of the same rank is acknowledged and ignored.
    if (step < version || p.contributed[rank]) continue;
    float* sum = p.grad_sum.data();
    const bool first = p.num_contributors == 0;
    ForEachGradientRun(payload, piece.offset, n, piece.dtype, &scratch,
                       [&](const float* grad, int64_t start, int64_t count) {
                         float* out = sum + start;
                         if (first) {
                           std::memcpy(out, grad, count * kFloatBytes);
                         } else {
                           for (int64_t i = 0; i < count; ++i) out[i] += grad[i];
                         }
                       });
    p.contributed[rank] = true;
    if (++p.num_contributors < job->sync_quorum) continue;
    const float scale = 1.f / static_cast<float>(p.num_contributors);
    for (int64_t i = 0; i < n; ++i) sum[i] *= scale;
    float* slots[2] = {nullptr, nullptr};
    for (size_t i = 0; i < num_slots; ++i) slots[i] = slot_arrays[i].data();
    ApplyOptimizer(job->optimizer, HyperparamsAt(job->optimizer_spec, version), sum, n, values,
                   slots);
    std::fill(p.contributed.begin(), p.contributed.end(), false);
    p.num_contributors = 0;
    p.version.store(version + 1, std::memory_order_release);
  }
  settle(true);
  return PushResponse();
}

absl::StatusOr<PullResponse> ParameterStore::Pull(const PullRequest& request, absl::Time deadline,
                                                  Payload* payload) {
  ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindJob(request.job_id()));
  if (!IsFloat32(request.dtype())) {
    return absl::UnimplementedError(absl::StrCat("pull from job ", job->id, ": dtype ",
                                                 DType_Name(request.dtype()),
                                                 " is not supported yet; pull FLOAT32"));
  }
  std::vector<Partition*> wanted;
  if (request.keys().empty()) {
    wanted.reserve(job->partitions.size());
    for (const auto& p : job->partitions) wanted.push_back(p.get());
  } else {
    wanted.reserve(request.keys_size());
    for (const PartitionKey& key : request.keys()) {
      auto it = job->by_key.find(KeyPair(key.tensor_id(), key.partition()));
      if (it == job->by_key.end()) {
        return absl::NotFoundError(absl::StrCat("pull from job ", job->id, ": no partition ",
                                                KeyName(key.tensor_id(), key.partition()),
                                                " on this shard"));
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
      for (int rank = 0; rank < job->num_workers; ++rank) {
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
  for (const Partition* p : wanted) total += p->num_elements * kFloatBytes;
  // One snapshot buffer, handed to the transport as is (no further copy).
  std::shared_ptr<char> buffer(new char[std::max<int64_t>(total, 1)],
                               std::default_delete<char[]>());
  char* out = buffer.get();
  *payload = Payload();
  payload->Append(buffer.get(), total, buffer);
  for (Partition* p : wanted) {
    PartitionHeader* header = response.add_partitions();
    header->mutable_key()->set_tensor_id(p->tensor_id);
    header->mutable_key()->set_partition(p->partition);
    header->set_dtype(FLOAT32);
    header->set_num_elements(p->num_elements);
    absl::MutexLock lock(&p->mu);
    header->set_version(p->version.load(std::memory_order_relaxed));
    std::memcpy(out, p->values.data(), p->num_elements * kFloatBytes);
    out += p->num_elements * kFloatBytes;
  }
  return response;
}

}  // namespace downpour
