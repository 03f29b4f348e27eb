#include "worker/param_exchange.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "spec/proto_dtype.h"
#include "worker/shard_retry.h"

namespace downpour {
namespace {

// Widens `n` elements of `dtype` at bytes [offset, ...) of `payload` into
// `out` (`add`: adds int8 changes to it, AddInt8): float32 straight from the
// buffers they arrived in, a narrowed type from the one buffer holding them
// all, or else through a small buffer of this thread's, chunk by chunk
// (network buffers may split an element).
void DecodePayload(const Payload& payload, size_t offset, int64_t n, WireDtype dtype, float* out,
                   bool add = false) {
  auto decode = [dtype, add](const char* in, int64_t count, float* to) {
    if (add) {
      AddInt8(in, count, to);
    } else {
      DecodeFloats(dtype, in, count, to);
    }
  };
  if (dtype == WireDtype::kFloat32 && !add) {
    payload.CopyTo(offset, n * sizeof(float), reinterpret_cast<char*>(out));
    return;
  }
  // Within one piece (a shared-memory answer is one): straight from it.
  size_t piece_start = 0;
  for (const Payload::Piece& piece : payload.pieces()) {
    if (offset >= piece_start && offset + WireBytes(dtype, n) <= piece_start + piece.size) {
      decode(piece.data + (offset - piece_start), n, out);
      return;
    }
    piece_start += piece.size;
  }
  // Whole int8 blocks: a chunk's bytes start at WireBytes(dtype, start).
  constexpr int64_t kChunk = 16 << 10;
  static_assert(kChunk % kInt8Block == 0);
  thread_local std::vector<char> raw;
  raw.resize(WireBytes(dtype, kChunk));
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t count = std::min(kChunk, n - start);
    payload.CopyTo(offset + WireBytes(dtype, start), WireBytes(dtype, count), raw.data());
    decode(raw.data(), count, out + start);
  }
}

}  // namespace

int64_t AutoMessageBytes(int64_t total_bytes) {
  return std::clamp<int64_t>(total_bytes / 32, 256 << 10, 4 << 20);
}

ParameterExchange::ParameterExchange(ExchangeOptions options,
                                     const std::vector<PartitionPlacement>& partitions,
                                     std::vector<ParameterShard*> shards)
    : options_(std::move(options)), shards_(std::move(shards)) {
  sequence_ = options_.first_sequence;
  std::vector<PartitionPlacement> sorted;
  for (const PartitionPlacement& p : partitions) {
    if (p.shard() >= 0 && p.shard() < static_cast<int>(shards_.size())) sorted.push_back(p);
  }
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.tensor_id(), a.partition()) <
           std::make_pair(b.tensor_id(), b.partition());
  });
  partitions_per_shard_.assign(shards_.size(), 0);
  int64_t total_bytes = 0;
  for (const PartitionPlacement& p : sorted) total_bytes += p.num_elements() * sizeof(float);
  const int64_t message_bytes =
      options_.message_bytes > 0 ? options_.message_bytes : AutoMessageBytes(total_bytes);
  // Consecutive partitions of a shard share a message up to message_bytes.
  std::vector<int> open(shards_.size(), -1);
  std::vector<int64_t> open_bytes(shards_.size(), 0);
  for (const PartitionPlacement& p : sorted) {
    const int s = p.shard();
    ++partitions_per_shard_[s];
    const int64_t bytes = p.num_elements() * static_cast<int64_t>(sizeof(float));
    if (open[s] < 0 || open_bytes[s] + bytes > message_bytes) {
      open[s] = static_cast<int>(messages_.size());
      open_bytes[s] = 0;
      messages_.push_back(Message{s, {}});
    }
    messages_[open[s]].partitions.push_back(p);
    open_bytes[s] += bytes;
  }
  // Int8 pulls hold the published copies whole: nothing is pulled narrowed.
  const bool int8_pulls = options_.parameter_dtype == WireDtype::kInt8;
  const absl::flat_hash_set<int32_t> reduced =
      int8_pulls ? absl::flat_hash_set<int32_t>()
                 : absl::flat_hash_set<int32_t>(options_.reduced_tensors.begin(),
                                                options_.reduced_tensors.end());
  for (Message& message : messages_) {
    message.held_lineage.assign(message.partitions.size(), 0);
    message.held_version.assign(message.partitions.size(), -1);
    for (const PartitionPlacement& p : message.partitions) {
      if (reduced.contains(p.tensor_id()) &&
          (message.reduced.empty() || message.reduced.back() != p.tensor_id())) {
        message.reduced.push_back(p.tensor_id());
      }
    }
  }
  for (int i = 0; i < static_cast<int>(messages_.size()); ++i) {
    int distinct = 0;
    for (size_t k = 0; k < messages_[i].partitions.size(); ++k) {
      const int tensor = messages_[i].partitions[k].tensor_id();
      if (tensor >= static_cast<int>(messages_of_tensor_.size())) {
        messages_of_tensor_.resize(tensor + 1);
      }
      std::vector<int>& of_tensor = messages_of_tensor_[tensor];
      if (of_tensor.empty() || of_tensor.back() != i) {
        of_tensor.push_back(i);
        ++distinct;
      }
    }
    tensors_in_message_.push_back(distinct);
    if (messages_[i].shard == 0) testing_left_.fetch_add(1);
  }
  // A streamed step's messages all run on the pool (the caller computes).
  const int threads = std::max(1, options_.max_inflight);
  window_ = threads;
  for (int i = 0; i < threads; ++i) pool_.emplace_back([this] { PoolLoop(); });
}

ParameterExchange::~ParameterExchange() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : pool_) t.join();
}

void ParameterExchange::PoolLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(
        +[](ParameterExchange* self)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) { return self->stopping_ || self->CanRun(); },
        this));
    if (stopping_) return;
    RunNext();
  }
}

void ParameterExchange::SetWindow(int depth) {
  absl::MutexLock lock(&mu_);
  window_ = std::clamp(depth, 1, static_cast<int>(pool_.size()));
}

ParameterExchange::StreamedSeconds ParameterExchange::streamed_seconds() const {
  absl::MutexLock lock(&mu_);
  return streamed_;
}

int ParameterExchange::window() const {
  absl::MutexLock lock(&mu_);
  return window_;
}

void ParameterExchange::Queue(int i) { queue_.push(i); }

void ParameterExchange::RunNext() {
  const int i = queue_.top();
  queue_.pop();
  ++running_;
  const std::shared_ptr<const std::function<absl::Status(int)>> task = task_;
  mu_.Unlock();
  absl::Status status = (*task)(i);
  mu_.Lock();
  --running_;
  --pending_;
  finished_[i] = true;
  while (finished_prefix_ < static_cast<int>(finished_.size()) && finished_[finished_prefix_]) {
    ++finished_prefix_;
  }
  if (!status.ok() && first_error_.ok()) first_error_ = status;
}

absl::Status ParameterExchange::Drain() {
  absl::MutexLock lock(&mu_);
  while (true) {
    // Help with the queue, then wait for what is running or unreleased.
    while (CanRun()) RunNext();
    if (pending_ == 0) break;
    mu_.Await(absl::Condition(
        +[](ParameterExchange* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
          return self->pending_ == 0 || self->CanRun();
        },
        this));
  }
  task_ = nullptr;
  absl::Status status = first_error_;
  first_error_ = absl::OkStatus();
  return status;
}

absl::Status ParameterExchange::RunAll(int n, const std::function<absl::Status(int)>& task) {
  {
    absl::MutexLock lock(&mu_);
    task_ = std::make_shared<const std::function<absl::Status(int)>>(task);
    pending_ = n;
    finished_.assign(n, false);
    finished_prefix_ = 0;
    first_error_ = absl::OkStatus();
    for (int i = 0; i < n; ++i) Queue(i);
  }
  return Drain();
}

PushRequest ParameterExchange::MakePushRequest(int i, int64_t step, int64_t sequence,
                                               const std::vector<const float*>& grads,
                                               Payload* payload) {
  Message& message = messages_[i];
  PushRequest request;
  request.set_job_id(options_.job_id);
  request.set_worker_rank(options_.rank);
  request.set_attempt(options_.attempt);
  request.set_step(step);
  request.set_partitions_in_step(partitions_per_shard_[message.shard]);
  request.set_checkpoint_step(checkpoint_step_);
  RequestId* id = request.mutable_request_id();
  id->set_worker_id(options_.worker_id);
  id->set_incarnation(options_.incarnation);
  id->set_sequence(sequence);
  request.set_skipped(grads.empty());
  const WireDtype dtype = options_.gradient_dtype;
  int64_t total = 0;
  int64_t total_bytes = 0;
  for (const PartitionPlacement& p : message.partitions) {
    total += p.num_elements();
    total_bytes += WireBytes(dtype, p.num_elements());
  }
  if (dtype != WireDtype::kFloat32 && !grads.empty()) message.encoded.resize(total_bytes);
  if (dtype == WireDtype::kInt8 && message.carry.empty()) message.carry.assign(total, 0.f);
  int64_t at = 0;
  int64_t at_bytes = 0;
  for (const PartitionPlacement& p : message.partitions) {
    PartitionHeader* header = request.add_partitions();
    header->mutable_key()->set_tensor_id(p.tensor_id());
    header->mutable_key()->set_partition(p.partition());
    header->set_dtype(DTypeOf(dtype));
    header->set_num_elements(p.num_elements());
    if (grads.empty()) continue;
    const float* grad = grads[p.tensor_id()] + p.offset();
    const int64_t bytes = WireBytes(dtype, p.num_elements());
    if (dtype == WireDtype::kFloat32) {
      // Sent from the model's memory; the call returns before it changes.
      payload->Append(reinterpret_cast<const char*>(grad), bytes);
    } else {
      // Made once per step and message: a retry resends these bytes.
      char* out = message.encoded.data() + at_bytes;
      if (dtype == WireDtype::kInt8) {
        EncodeInt8Carrying(grad, p.num_elements(), message.carry.data() + at, out);
      } else {
        EncodeFloats(dtype, grad, p.num_elements(), out);
      }
      payload->Append(out, bytes);
    }
    at += p.num_elements();
    at_bytes += bytes;
  }
  return request;
}

PullRequest ParameterExchange::MakePullRequest(int i, int64_t min_version, int64_t min_worker_steps,
                                               bool exact_version) const {
  PullRequest request;
  request.set_job_id(options_.job_id);
  request.set_worker_rank(options_.rank);
  request.set_min_version(min_version);
  request.set_exact_version(exact_version);
  request.set_min_worker_steps(min_worker_steps);
  request.set_dtype(FLOAT32);
  const Message& message = messages_[i];
  if (options_.parameter_dtype == WireDtype::kInt8 && !exact_version) {
    request.set_change_dtype(INT8);
    request.mutable_held_lineage()->Add(message.held_lineage.begin(), message.held_lineage.end());
    request.mutable_held_version()->Add(message.held_version.begin(), message.held_version.end());
  }
  if (!messages_[i].reduced.empty()) {
    request.set_reduced_dtype(DTypeOf(options_.reduced_dtype));
    request.mutable_reduced_tensor_ids()->Add(messages_[i].reduced.begin(),
                                              messages_[i].reduced.end());
  }
  for (const PartitionPlacement& p : messages_[i].partitions) {
    PartitionKey* key = request.add_keys();
    key->set_tensor_id(p.tensor_id());
    key->set_partition(p.partition());
  }
  return request;
}

absl::Status ParameterExchange::SendPush(int i, const PushRequest& request, const Payload& payload,
                                         absl::Time give_up,
                                         const std::function<bool()>& cancelled) {
  const int shard = messages_[i].shard;
  // Each attempt keeps the shard client's own deadline.
  return CallShardWithRetries(absl::StrCat("pushing to shard ", shard), give_up,
                              options_.pull_slice, PushCancelled(cancelled), [&](absl::Time) {
                                return shards_[shard]->Push(request, payload).status();
                              });
}

absl::Status ParameterExchange::ReceivePull(int i, const PullRequest& request, absl::Time give_up,
                                            const std::vector<float*>& params,
                                            const std::function<bool()>& cancelled) {
  const int shard = messages_[i].shard;
  Payload payload;
  PullResponse response;
  RETURN_IF_ERROR(CallShardWithRetries(absl::StrCat("pulling from shard ", shard), give_up,
                                       options_.pull_slice, cancelled, [&](absl::Time deadline) {
                                         absl::StatusOr<PullResponse> pulled =
                                             shards_[shard]->Pull(request, deadline, &payload);
                                         if (pulled.ok()) response = *std::move(pulled);
                                         return pulled.status();
                                       }));
  return CopyPulled(i, response, payload, params,
                    request.exact_version() ? request.min_version() : -1);
}

absl::Status ParameterExchange::CopyPulled(int i, const PullResponse& response,
                                           const Payload& payload,
                                           const std::vector<float*>& params,
                                           int64_t exact_version) {
  Message& message = messages_[i];
  if (response.partitions_size() != static_cast<int>(message.partitions.size())) {
    return absl::InternalError(absl::StrCat("shard ", message.shard, " returned ",
                                            response.partitions_size(), " partitions, asked ",
                                            message.partitions.size()));
  }
  auto malformed = [&](const PartitionPlacement& p, absl::string_view why) {
    return absl::InternalError(absl::StrCat("shard ", message.shard,
                                            " returned a malformed pull: partition ", p.tensor_id(),
                                            "/", p.partition(), " ", why));
  };
  size_t offset = 0;
  for (int k = 0; k < response.partitions_size(); ++k) {
    const PartitionPlacement& p = message.partitions[k];
    const PartitionHeader& header = response.partitions(k);
    // Float32, the narrowed type where it was asked for (a shard that does
    // not know reduced pulls answers float32), or an int8 change to the
    // published copy held.
    const bool reduced =
        !header.change() && header.dtype() != FLOAT32 && header.dtype() != DTYPE_UNSPECIFIED;
    const WireDtype dtype = header.change() ? WireDtype::kInt8
                            : reduced       ? options_.reduced_dtype
                                            : WireDtype::kFloat32;
    const size_t size = WireBytes(dtype, p.num_elements());
    if (header.num_elements() != p.num_elements() || offset + size > payload.size()) {
      return malformed(p, "has other sizes than asked");
    }
    if (reduced &&
        (header.dtype() != DTypeOf(options_.reduced_dtype) ||
         !std::binary_search(message.reduced.begin(), message.reduced.end(), p.tensor_id()))) {
      return malformed(p, absl::StrCat("is ", DType_Name(header.dtype()), ", not asked for"));
    }
    if (header.change() && (header.dtype() != INT8 || header.lineage() != message.held_lineage[k] ||
                            header.base_version() != message.held_version[k])) {
      return malformed(
          p, absl::StrCat("is a change from copy ", header.lineage(), " version ",
                          header.base_version(), "; this worker holds ", message.held_lineage[k],
                          " version ", message.held_version[k]));
    }
    if (exact_version >= 0 && header.version() != exact_version) {
      // A shard from before exact versions answers its current values.
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", message.shard, " answered partition ", p.tensor_id(), "/",
                       p.partition(), " at version ", header.version(), ", not the exact version ",
                       exact_version, " asked for"));
    }
    DecodePayload(payload, offset, p.num_elements(), dtype, params[p.tensor_id()] + p.offset(),
                  /*add=*/header.change());
    offset += size;
    // What the host parameters hold now: a published copy (its lineage set)
    // or the values as they were.
    message.held_lineage[k] = header.lineage();
    message.held_version[k] = header.lineage() != 0 ? header.version() : -1;
    const int64_t version = header.version();
    int64_t seen = min_pulled_version_.load(std::memory_order_relaxed);
    while (version < seen && !min_pulled_version_.compare_exchange_weak(seen, version)) {
    }
  }
  return absl::OkStatus();
}

absl::Status ParameterExchange::Pull(int64_t min_version, int64_t min_worker_steps,
                                     const std::vector<float*>& params,
                                     const std::function<bool()>& cancelled, bool exact_version) {
  const absl::Time give_up = absl::Now() + options_.pull_timeout;
  min_pulled_version_.store(std::numeric_limits<int64_t>::max());
  // First layers first: messages_ is in tensor order.
  return RunAll(static_cast<int>(messages_.size()), [&](int i) -> absl::Status {
    return ReceivePull(i, MakePullRequest(i, min_version, min_worker_steps, exact_version), give_up,
                       params, cancelled);
  });
}

absl::Status ParameterExchange::Push(int64_t step, const std::vector<const float*>& grads,
                                     const std::function<bool()>& cancelled) {
  const int n = static_cast<int>(messages_.size());
  const int64_t first_sequence = sequence_ + 1;
  sequence_ += n;
  const absl::Time give_up = absl::Now() + options_.push_timeout;
  // Last layers first: the order backward produces the gradients.
  absl::Status status = RunAll(n, [&](int k) -> absl::Status {
    const int i = n - 1 - k;
    Payload payload;
    const PushRequest request = MakePushRequest(i, step, first_sequence + i, grads, &payload);
    return SendPush(i, request, payload, give_up, cancelled);
  });
  checkpoint_step_ = 0;
  return status;
}

absl::Status ParameterExchange::CaptureNow(int64_t checkpoint_step, int64_t last_step,
                                           const std::function<bool()>& cancelled) {
  const int shards = static_cast<int>(shards_.size());
  const int64_t first_sequence = sequence_ + 1;
  sequence_ += shards;
  const absl::Time give_up = absl::Now() + options_.push_timeout;
  return RunAll(shards, [&](int shard) -> absl::Status {
    PushRequest request;
    request.set_job_id(options_.job_id);
    request.set_worker_rank(options_.rank);
    request.set_attempt(options_.attempt);
    request.set_step(last_step);
    request.set_checkpoint_step(checkpoint_step);
    RequestId* id = request.mutable_request_id();
    id->set_worker_id(options_.worker_id);
    id->set_incarnation(options_.incarnation);
    id->set_sequence(first_sequence + shard);
    // No partitions: SendPush addresses messages, so the shard is called
    // directly, with the same retries.
    return CallShardWithRetries(
        absl::StrCat("asking shard ", shard, " for a checkpoint"), give_up, options_.pull_slice,
        cancelled, [&](absl::Time) { return shards_[shard]->Push(request, Payload()).status(); });
  });
}

absl::Status ParameterExchange::ExchangeMessage(int i, int64_t step, int64_t sequence,
                                                const std::vector<const float*>& grads,
                                                int64_t min_version, int64_t min_worker_steps,
                                                absl::Time push_give_up, absl::Time pull_give_up,
                                                const std::vector<float*>& params,
                                                const std::function<bool()>& cancelled,
                                                const PulledFn* pulled, MessageTimes* times) {
  // Tells `pulled` of the message's partitions once they are in params.
  auto landed = [&](absl::Status copied) -> absl::Status {
    if (!copied.ok() || pulled == nullptr || *pulled == nullptr) return copied;
    for (const PartitionPlacement& p : messages_[i].partitions) RETURN_IF_ERROR((*pulled)(p));
    return absl::OkStatus();
  };
  if (step == options_.testing_stall_step && messages_[i].shard != 0) {
    if (!options_.testing_stale_push) absl::Notification().WaitForNotification();
    while (!cancelled()) absl::SleepFor(absl::Milliseconds(50));
    absl::SleepFor(absl::Seconds(2));
    Payload payload;
    const PushRequest push = MakePushRequest(i, step, sequence, grads, &payload);
    const int shard = messages_[i].shard;
    const absl::Status sent = CallShardWithRetries(
        absl::StrCat("pushing to shard ", shard), absl::Now() + absl::Seconds(2),
        options_.pull_slice, [] { return false; },
        [&](absl::Time) { return shards_[shard]->Push(push, payload).status(); });
    Log(absl::StrCat("testing: job ", options_.job_id, " rank ", options_.rank, " pushed step ",
                     step, " to shard ", shard, " after losing the rank: ", sent.ToString()));
    return absl::CancelledError("job ended");
  }
  // Shard 0's messages of the testing step, once exchanged, say so.
  auto testing_done = [&](absl::Status status) {
    if (status.ok() && step == options_.testing_stall_step && testing_left_.fetch_sub(1) == 1) {
      Log(absl::StrCat("testing: job ", options_.job_id, " rank ", options_.rank, " pushed step ",
                       step, " to shard 0 only"));
    }
    return status;
  };
  Payload payload;
  const PushRequest push = MakePushRequest(i, step, sequence, grads, &payload);
  const PullRequest pull = MakePullRequest(i, min_version, min_worker_steps);
  if (cancelled()) {
    // Stopping: where pushes go on (a drain), the push still goes, alone.
    if (!PushCancelled(cancelled)()) {
      RETURN_IF_ERROR(SendPush(i, push, payload, push_give_up, cancelled));
    }
    return absl::CancelledError("job ended");
  }
  if (abandoning_.load()) {
    // The step is abandoned (FinishPushPull): its released messages are
    // pushed, and none waits for parameters the other workers may never
    // let the shard answer (they wait for this worker's unreleased ones).
    return SendPush(i, push, payload, push_give_up, cancelled);
  }
  Payload values;
  const double sent = MonotonicSeconds();
  absl::StatusOr<PushPullResponse> response = shards_[messages_[i].shard]->PushPull(
      push, payload, pull,
      std::min({push_give_up, pull_give_up, absl::Now() + options_.pull_slice}), &values);
  // An answered round trip only (a retried one's wait is no round trip),
  // from a shard that says how long it held it (as SparseExchange counts).
  if (times != nullptr && response.ok() && response->handled_us() > 0) {
    times->sent = sent;
    times->answered = MonotonicSeconds();
    times->handled = static_cast<double>(response->handled_us()) * 1e-6;
  }
  if (response.ok()) return testing_done(landed(CopyPulled(i, response->pull(), values, params)));
  if (!IsRetryableShardError(response.status())) {
    return Annotate(response.status(), absl::StrCat("exchanging with shard ", messages_[i].shard));
  }
  // A timeout or lost connection (or a pull still waiting for other
  // workers): finish with separate calls. The push keeps its request id,
  // so it is applied once whether or not the combined call applied it.
  RETURN_IF_ERROR(SendPush(i, push, payload, push_give_up, cancelled));
  const std::function<bool()> pull_cancelled = [this, &cancelled] {
    return abandoning_.load() || cancelled();
  };
  absl::Status received = ReceivePull(i, pull, pull_give_up, params, pull_cancelled);
  if (!received.ok() && abandoning_.load() && !cancelled()) return absl::OkStatus();
  return testing_done(landed(received));
}

absl::Status ParameterExchange::PushPull(int64_t step, const std::vector<const float*>& grads,
                                         int64_t min_version, int64_t min_worker_steps,
                                         const std::vector<float*>& params,
                                         const std::function<bool()>& cancelled) {
  if (min_worker_steps > step) {
    // The pull waits for this very step's pushes (SSP with staleness 0):
    // each message's pull would hold its place in the window until the
    // step's last message is pushed, so the pushes go first.
    RETURN_IF_ERROR(Push(step, grads, cancelled));
    return Pull(min_version, min_worker_steps, params, cancelled);
  }
  // A streamed step whose gradients are all ready at once: every message
  // queued, first layers first (the order the next forward needs them).
  BeginPushPull(step, grads, min_version, min_worker_steps, params, cancelled);
  for (int id = 0; id < static_cast<int>(messages_of_tensor_.size()); ++id) {
    GradientReady(id, nullptr);
  }
  return FinishPushPull();
}

void ParameterExchange::BeginPushPull(int64_t step, const std::vector<const float*>& grads,
                                      int64_t min_version, int64_t min_worker_steps,
                                      const std::vector<float*>& params,
                                      const std::function<bool()>& cancelled, PulledFn pulled) {
  const int n = static_cast<int>(messages_.size());
  const int64_t first_sequence = sequence_ + 1;
  sequence_ += n;
  const absl::Time now = absl::Now();
  const absl::Time push_give_up = now + options_.push_timeout;
  const absl::Time pull_give_up = now + options_.pull_timeout;
  min_pulled_version_.store(std::numeric_limits<int64_t>::max());
  absl::MutexLock lock(&mu_);
  unready_ = tensors_in_message_;
  finished_.assign(n, false);
  finished_prefix_ = 0;
  ready_wait_.assign(n, nullptr);
  unreleased_ = n;
  pending_ = n;
  first_error_ = absl::OkStatus();
  message_times_.assign(n, MessageTimes());
  // Copies: the step's pointers, for tasks that run after this returns.
  task_ = std::make_shared<const std::function<absl::Status(int)>>(
      [this, step, first_sequence, grads, min_version, min_worker_steps, push_give_up, pull_give_up,
       params, cancelled, pulled](int i) -> absl::Status {
        std::function<absl::Status()> wait;
        {
          absl::MutexLock lock(&mu_);
          wait = std::move(ready_wait_[i]);
        }
        if (wait) RETURN_IF_ERROR(Annotate(wait(), "waiting for the gradients to push"));
        MessageTimes& times = message_times_[i];
        times.ready = MonotonicSeconds();
        absl::Status exchanged =
            ExchangeMessage(i, step, first_sequence + i, grads, min_version, min_worker_steps,
                            push_give_up, pull_give_up, params, cancelled, &pulled, &times);
        times.done = MonotonicSeconds();
        return exchanged;
      });
  // A model without tensors has nothing to wait for.
  for (int i = 0; i < n; ++i) {
    if (unready_[i] == 0) {
      --unreleased_;
      Queue(i);
    }
  }
}

void ParameterExchange::GradientReady(int tensor_id, std::function<absl::Status()> wait) {
  if (tensor_id < 0 || tensor_id >= static_cast<int>(messages_of_tensor_.size())) return;
  absl::MutexLock lock(&mu_);
  for (int i : messages_of_tensor_[tensor_id]) {
    if (unready_[i] <= 0) continue;  // Announced twice: sent already.
    ready_wait_[i] = wait;           // The last announced is the last to land.
    if (--unready_[i] == 0) {
      --unreleased_;
      Queue(i);
    }
  }
}

absl::Status ParameterExchange::AwaitTensors(const std::vector<int32_t>& tensor_ids) {
  absl::MutexLock lock(&mu_);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!first_error_.ok()) return true;
    for (int32_t id : tensor_ids) {
      if (id < 0 || id >= static_cast<int>(messages_of_tensor_.size())) continue;
      for (int i : messages_of_tensor_[id]) {
        if (static_cast<size_t>(i) < finished_.size() && !finished_[i]) return false;
      }
    }
    return true;
  };
  // The waiting thread helps with the queue, as Drain does.
  auto done_or_runnable = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done() || CanRun(); };
  while (!done()) {
    if (CanRun()) {
      RunNext();
      continue;
    }
    mu_.Await(absl::Condition(&done_or_runnable));
  }
  return first_error_;
}

absl::Status ParameterExchange::FinishPushPull(bool abandon) {
  // The messages under way give up their waits (the other workers may
  // never push the step's rest, which waits for this worker's).
  if (abandon) abandoning_.store(true);
  {
    absl::MutexLock lock(&mu_);
    if (unreleased_ > 0) {
      if (!abandon && first_error_.ok()) {
        first_error_ = absl::InternalError(
            absl::StrCat(unreleased_, " push messages never had all their gradients announced"));
      }
      // Never sent: they hold gradients not computed.
      pending_ -= unreleased_;
      unreleased_ = 0;
      for (int& left : unready_) left = 0;
    }
  }
  absl::Status status = Drain();
  if (status.ok() && !abandon) {
    // Every task has returned (Drain): their times are theirs no more.
    double first_ready = std::numeric_limits<double>::infinity(), last_ready = 0;
    const MessageTimes* last = nullptr;
    for (const MessageTimes& times : message_times_) {
      if (times.done == 0) continue;  // Never run.
      first_ready = std::min(first_ready, times.ready);
      last_ready = std::max(last_ready, times.ready);
      if (last == nullptr || times.done > last->done) last = &times;
    }
    absl::MutexLock lock(&mu_);
    if (last != nullptr) {
      streamed_.steps += 1;
      streamed_.from_first_ready += last->done - first_ready;
      streamed_.from_last_ready += last->done - last_ready;
      if (last->sent > 0) {
        streamed_.last_round_trip += last->answered - last->sent;
        streamed_.last_on_shard += last->handled;
      }
    }
  }
  abandoning_.store(false);
  checkpoint_step_ = 0;
  return status;
}

}  // namespace downpour
