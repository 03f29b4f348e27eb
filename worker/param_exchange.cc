#include "worker/param_exchange.h"

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
  partitions_by_shard_.resize(shards_.size());
  for (const PartitionPlacement& p : partitions) {
    if (p.shard() >= 0 && p.shard() < static_cast<int>(shards_.size())) {
      partitions_by_shard_[p.shard()].push_back(p);
    }
  }
}

absl::Status ParameterExchange::Pull(int64_t min_version, int64_t min_worker_steps,
                                     const std::vector<float*>& params,
                                     const std::function<bool()>& cancelled) {
  for (size_t shard = 0; shard < shards_.size(); ++shard) {
    PullRequest request;
    request.set_job_id(options_.job_id);
    request.set_worker_rank(options_.rank);
    request.set_min_version(min_version);
    request.set_min_worker_steps(min_worker_steps);
    request.set_dtype(FLOAT32);
    for (const PartitionPlacement& p : partitions_by_shard_[shard]) {
      PartitionKey* key = request.add_keys();
      key->set_tensor_id(p.tensor_id());
      key->set_partition(p.partition());
    }
    const absl::Time give_up = absl::Now() + options_.pull_timeout;
    absl::StatusOr<PullResponse> response;
    while (true) {
      if (cancelled()) return absl::CancelledError("job ended");
      response =
          shards_[shard]->Pull(request, std::min(give_up, absl::Now() + options_.pull_slice));
      if (response.ok() || !Retryable(response.status()) || absl::Now() >= give_up) break;
    }
    if (!response.ok()) {
      return Annotate(response.status(), absl::StrCat("pulling from shard ", shard));
    }
    if (response->partitions_size() != request.keys_size()) {
      return absl::InternalError(absl::StrCat("shard ", shard, " returned ",
                                              response->partitions_size(), " partitions, asked ",
                                              request.keys_size()));
    }
    const char* bytes = response->payload().data();
    size_t offset = 0;
    for (int i = 0; i < response->partitions_size(); ++i) {
      const PartitionPlacement& p = partitions_by_shard_[shard][i];
      const size_t size = p.num_elements() * sizeof(float);
      if (response->partitions(i).num_elements() != p.num_elements() ||
          offset + size > response->payload().size()) {
        return absl::InternalError(absl::StrCat("shard ", shard, " returned a malformed pull"));
      }
      std::memcpy(params[p.tensor_id()] + p.offset(), bytes + offset, size);
      offset += size;
    }
  }
  return absl::OkStatus();
}

absl::Status ParameterExchange::Push(int64_t step, const std::vector<const float*>& grads) {
  for (size_t shard = 0; shard < shards_.size(); ++shard) {
    PushRequest request;
    request.set_job_id(options_.job_id);
    request.set_worker_rank(options_.rank);
    request.set_step(step);
    RequestId* id = request.mutable_request_id();
    id->set_worker_id(options_.worker_id);
    id->set_incarnation(options_.incarnation);
    id->set_sequence(++sequence_);
    std::string* payload = request.mutable_payload();
    int64_t total = 0;
    for (const PartitionPlacement& p : partitions_by_shard_[shard]) total += p.num_elements();
    payload->reserve(total * sizeof(float));
    for (const PartitionPlacement& p : partitions_by_shard_[shard]) {
      PartitionHeader* header = request.add_partitions();
      header->mutable_key()->set_tensor_id(p.tensor_id());
      header->mutable_key()->set_partition(p.partition());
      header->set_dtype(FLOAT32);
      header->set_num_elements(p.num_elements());
      payload->append(reinterpret_cast<const char*>(grads[p.tensor_id()] + p.offset()),
                      p.num_elements() * sizeof(float));
    }
    auto response = shards_[shard]->Push(request);
    if (!response.ok()) {
      return Annotate(response.status(), absl::StrCat("pushing to shard ", shard));
    }
  }
  return absl::OkStatus();
}

}  // namespace downpour
