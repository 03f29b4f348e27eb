#include "worker/param_exchange.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace downpour {
namespace {

bool Retryable(const absl::Status& status) {
  return absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status) ||
         absl::IsNotFound(status);
}

}  // namespace

ParameterExchange::ParameterExchange(ExchangeOptions options,
                                     const std::vector<PartitionPlacement>& partitions,
                                     std::vector<ParameterShard*> shards)
    : options_(std::move(options)), shards_(std::move(shards)) {
  std::vector<PartitionPlacement> sorted;
  for (const PartitionPlacement& p : partitions) {
    if (p.shard() >= 0 && p.shard() < static_cast<int>(shards_.size())) sorted.push_back(p);
  }
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.tensor_id(), a.partition()) <
           std::make_pair(b.tensor_id(), b.partition());
  });
  partitions_per_shard_.assign(shards_.size(), 0);
  // Consecutive partitions of a shard share a message up to message_bytes.
  std::vector<int> open(shards_.size(), -1);
  std::vector<int64_t> open_bytes(shards_.size(), 0);
  for (const PartitionPlacement& p : sorted) {
    const int s = p.shard();
    ++partitions_per_shard_[s];
    const int64_t bytes = p.num_elements() * static_cast<int64_t>(sizeof(float));
    if (open[s] < 0 || open_bytes[s] + bytes > options_.message_bytes) {
      open[s] = static_cast<int>(messages_.size());
      open_bytes[s] = 0;
      messages_.push_back(Message{s, {}, {}});
    }
    messages_[open[s]].partitions.push_back(p);
    open_bytes[s] += bytes;
  }
  const int threads = std::max(0, options_.max_inflight - 1);  // The caller runs tasks too.
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
        +[](ParameterExchange* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
          return self->stopping_ || self->next_task_ < self->num_tasks_;
        },
        this));
    if (stopping_) return;
    const int i = next_task_++;
    ++running_;
    const std::function<absl::Status(int)>* task = task_;
    mu_.Unlock();
    absl::Status status = (*task)(i);
    mu_.Lock();
    --running_;
    if (!status.ok() && first_error_.ok()) first_error_ = status;
  }
}

absl::Status ParameterExchange::RunAll(int n, const std::function<absl::Status(int)>& task) {
  absl::MutexLock lock(&mu_);
  task_ = &task;
  num_tasks_ = n;
  next_task_ = 0;
  first_error_ = absl::OkStatus();
  while (next_task_ < num_tasks_) {
    const int i = next_task_++;
    ++running_;
    mu_.Unlock();
    absl::Status status = task(i);
    mu_.Lock();
    --running_;
    if (!status.ok() && first_error_.ok()) first_error_ = status;
  }
  mu_.Await(absl::Condition(
      +[](ParameterExchange* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
        return self->running_ == 0;
      },
      this));
  task_ = nullptr;
  num_tasks_ = 0;
  next_task_ = 0;
  return first_error_;
}

absl::Status ParameterExchange::Pull(int64_t min_version, int64_t min_worker_steps,
                                     const std::vector<float*>& params,
                                     const std::function<bool()>& cancelled) {
  const absl::Time give_up = absl::Now() + options_.pull_timeout;
  // First layers first: messages_ is in tensor order.
  return RunAll(static_cast<int>(messages_.size()), [&](int i) -> absl::Status {
    const Message& message = messages_[i];
    PullRequest request;
    request.set_job_id(options_.job_id);
    request.set_worker_rank(options_.rank);
    request.set_min_version(min_version);
    request.set_min_worker_steps(min_worker_steps);
    request.set_dtype(FLOAT32);
    for (const PartitionPlacement& p : message.partitions) {
      PartitionKey* key = request.add_keys();
      key->set_tensor_id(p.tensor_id());
      key->set_partition(p.partition());
    }
    ParameterShard* shard = shards_[message.shard];
    Payload payload;
    absl::StatusOr<PullResponse> response;
    while (true) {
      if (cancelled()) return absl::CancelledError("job ended");
      response = shard->Pull(request, std::min(give_up, absl::Now() + options_.pull_slice),
                             &payload);
      if (response.ok() || !Retryable(response.status()) || absl::Now() >= give_up) break;
    }
    if (!response.ok()) {
      return Annotate(response.status(), absl::StrCat("pulling from shard ", message.shard));
    }
    if (response->partitions_size() != request.keys_size()) {
      return absl::InternalError(absl::StrCat("shard ", message.shard, " returned ",
                                              response->partitions_size(), " partitions, asked ",
                                              request.keys_size()));
    }
    size_t offset = 0;
    for (int k = 0; k < response->partitions_size(); ++k) {
      const PartitionPlacement& p = message.partitions[k];
      const size_t size = p.num_elements() * sizeof(float);
      if (response->partitions(k).num_elements() != p.num_elements() ||
          offset + size > payload.size()) {
        return absl::InternalError(
            absl::StrCat("shard ", message.shard, " returned a malformed pull"));
      }
      payload.CopyTo(offset, size, reinterpret_cast<char*>(params[p.tensor_id()] + p.offset()));
      offset += size;
    }
    return absl::OkStatus();
  });
}

absl::Status ParameterExchange::Push(int64_t step, const std::vector<const float*>& grads,
                                     const std::function<bool()>& cancelled) {
  const int n = static_cast<int>(messages_.size());
  const int64_t first_sequence = sequence_ + 1;
  sequence_ += n;
  const int width = WireBytesPerElement(options_.gradient_dtype);
  const absl::Time give_up = absl::Now() + options_.push_timeout;
  // Last layers first: the order backward produces the gradients.
  return RunAll(n, [&](int k) -> absl::Status {
    const int i = n - 1 - k;
    Message& message = messages_[i];
    PushRequest request;
    request.set_job_id(options_.job_id);
    request.set_worker_rank(options_.rank);
    request.set_step(step);
    request.set_partitions_in_step(partitions_per_shard_[message.shard]);
    RequestId* id = request.mutable_request_id();
    id->set_worker_id(options_.worker_id);
    id->set_incarnation(options_.incarnation);
    id->set_sequence(first_sequence + i);
    Payload payload;
    int64_t total = 0;
    for (const PartitionPlacement& p : message.partitions) total += p.num_elements();
    if (width != 4) message.encoded.resize(total * width);
    int64_t at = 0;
    for (const PartitionPlacement& p : message.partitions) {
      PartitionHeader* header = request.add_partitions();
      header->mutable_key()->set_tensor_id(p.tensor_id());
      header->mutable_key()->set_partition(p.partition());
      header->set_dtype(options_.gradient_dtype);
      header->set_num_elements(p.num_elements());
      const float* grad = grads[p.tensor_id()] + p.offset();
      if (width == 4) {
        // Sent from the model's memory; the call returns before it changes.
        payload.Append(reinterpret_cast<const char*>(grad), p.num_elements() * sizeof(float));
      } else {
        char* out = message.encoded.data() + at * width;
        EncodeGradients(options_.gradient_dtype, grad, p.num_elements(), out);
        payload.Append(out, p.num_elements() * width);
      }
      at += p.num_elements();
    }
    // The same request id on every attempt: the shard applies it once.
    while (true) {
      if (cancelled()) return absl::CancelledError("job ended");
      absl::StatusOr<PushResponse> response = shards_[message.shard]->Push(request, payload);
      if (response.ok()) return absl::OkStatus();
      const bool retry = absl::IsDeadlineExceeded(response.status()) ||
                         absl::IsUnavailable(response.status());
      if (!retry || absl::Now() >= give_up) {
        return Annotate(response.status(), absl::StrCat("pushing to shard ", message.shard));
      }
      // A refused connection fails at once; do not spin on it.
      if (absl::IsUnavailable(response.status())) absl::SleepFor(absl::Milliseconds(50));
    }
  });
}

}  // namespace downpour
