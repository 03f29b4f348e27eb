#include "model/replica_set.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status.h"
#include "kernels/factory.h"

namespace downpour {
namespace {

int64_t ParamCount(const Model& model) {
  int64_t n = 0;
  for (const ParamInfo& p : model.params()) n += p.num_elements;
  return n;
}

// Slice r of `batch` over n replicas is [begin[r], begin[r + 1]).
std::vector<int64_t> SliceStarts(int64_t batch, int n) {
  std::vector<int64_t> begin(n + 1);
  for (int r = 0; r <= n; ++r) begin[r] = batch * r / n;
  return begin;
}

// Each replica's gradient is the mean over its slice, so the batch mean
// weighs replica r's by its share of the batch.
std::vector<float> SliceWeights(const std::vector<int64_t>& begin) {
  const int64_t batch = begin.back();
  std::vector<float> weights(begin.size() - 1);
  for (size_t r = 0; r + 1 < begin.size(); ++r) {
    weights[r] = static_cast<float>(begin[r + 1] - begin[r]) / static_cast<float>(batch);
  }
  return weights;
}

// The batch's result from its slices': the first error, else the loss
// weighted by slice, the correct counts summed, skipped if any slice was.
absl::StatusOr<StepResult> CombineSlices(const std::vector<absl::StatusOr<StepResult>>& results,
                                         const std::vector<int64_t>& begin) {
  const int64_t batch = begin.back();
  StepResult total;
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r].ok()) return results[r].status();
    const double share = static_cast<double>(begin[r + 1] - begin[r]) / static_cast<double>(batch);
    total.loss += share * results[r]->loss;
    total.correct += results[r]->correct;
    // A replica whose FP16 step overflowed zeroed its gradients; the whole
    // step is skipped so no partial gradient is pushed.
    total.skipped = total.skipped || results[r]->skipped;
  }
  total.loss_scale = results[0]->loss_scale;
  return total;
}

void ZeroGrads(Model* model) {
  for (const ParamInfo& p : model->params()) {
    std::fill(model->grad(p.id), model->grad(p.id) + p.num_elements, 0.f);
  }
}

// Why the replicas cannot share NCCL communicators, or "" when they can.
std::string WhyNotNccl(const std::vector<std::unique_ptr<Model>>& replicas) {
  if (replicas.size() < 2) return "one replica";
  std::set<int> devices;
  for (const auto& r : replicas) {
    if (r->device() < 0) return "a replica computes on the CPU";
    if (!devices.insert(r->device()).second) return "two replicas share a GPU";
  }
  return "";
}

// The collectives move each replica's parameters and gradients as one block
// (model/model.h promises they are contiguous, in params() order); checked
// here, once, rather than trusted.
absl::Status CheckContiguous(Model* model) {
  if (model->params().empty()) return absl::OkStatus();
  int64_t offset = 0;
  for (const ParamInfo& p : model->params()) {
    if (model->device_param(p.id) != model->device_param(0) + offset ||
        model->device_grad(p.id) != model->device_grad(0) + offset) {
      return absl::InternalError(absl::StrCat("parameter ", p.name, " of the replica on ",
                                              model->device_name(),
                                              " is not where one contiguous block puts it"));
    }
    offset += p.num_elements;
  }
  return absl::OkStatus();
}

// Owner of each param id over n replicas: whole tensors in params() order,
// each to the replica whose equal cut of the block holds its middle (so
// owners never decrease and the shares are contiguous).
std::vector<int> ShareOwners(const Model& model, int n, int64_t total) {
  std::vector<int> owner;
  int64_t offset = 0;
  for (const ParamInfo& p : model.params()) {
    const int64_t middle = offset + p.num_elements / 2;
    owner.push_back(total == 0 ? 0
                               : static_cast<int>(std::min<int64_t>(n - 1, middle * n / total)));
    offset += p.num_elements;
  }
  return owner;
}

// The contiguous shares the owners make, one per replica (empty where a
// replica owns nothing).
std::vector<kernels::DeviceShare> SharesOf(const Model& model, const std::vector<int>& owner,
                                           int n) {
  std::vector<kernels::DeviceShare> shares(n);
  for (int r = 0; r < n; ++r) shares[r].owner = r;
  int64_t offset = 0;
  for (size_t id = 0; id < owner.size(); ++id) {
    kernels::DeviceShare& share = shares[owner[id]];
    if (share.count == 0) share.offset = offset;
    share.count += model.params()[id].num_elements;
    offset += model.params()[id].num_elements;
  }
  return shares;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ReplicaSet>> ReplicaSet::Create(
    std::vector<std::unique_ptr<Model>> replicas) {
  if (replicas.empty()) return absl::InvalidArgumentError("a replica set needs a replica");
  for (const auto& r : replicas) {
    const auto& a = r->params();
    const auto& b = replicas[0]->params();
    const bool same = a.size() == b.size() &&
                      std::equal(a.begin(), a.end(), b.begin(), [](const auto& x, const auto& y) {
                        return x.num_elements == y.num_elements;
                      });
    if (!same) {
      return absl::InvalidArgumentError(absl::StrCat("the replica on ", r->device_name(),
                                                     " has other parameters than the one on ",
                                                     replicas[0]->device_name()));
    }
  }
  std::unique_ptr<kernels::DeviceGroup> nccl;
  const std::string why_not_nccl = WhyNotNccl(replicas);
  if (why_not_nccl.empty()) {
    std::vector<kernels::ComputeBackend*> backends;
    std::vector<std::string> names;
    for (const auto& r : replicas) {
      RETURN_IF_ERROR(CheckContiguous(r.get()));
      backends.push_back(&r->backend());
      names.push_back(r->device_name());
    }
    auto created = kernels::CreateDeviceGroup(backends);
    if (created.ok()) {
      nccl = std::move(created).value();
      Log(absl::StrCat("gradients of the replicas on ", absl::StrJoin(names, ", "),
                       " are reduced with NCCL"));
    } else {
      Log(absl::StrCat("cannot reduce gradients with NCCL (", created.status().message(),
                       "); averaging them on the host instead"));
    }
  } else if (replicas.size() >= 2) {
    Log(absl::StrCat("gradients of ", replicas.size(), " replicas are averaged on the host (",
                     why_not_nccl, ")"));
  }
  return std::unique_ptr<ReplicaSet>(new ReplicaSet(std::move(replicas), std::move(nccl)));
}

ReplicaSet::ReplicaSet(std::vector<std::unique_ptr<Model>> replicas,
                       std::unique_ptr<kernels::DeviceGroup> nccl)
    : replicas_(std::move(replicas)),
      param_count_(ParamCount(*replicas_[0])),
      nccl_(std::move(nccl)) {
  if (nccl_ == nullptr) return;
  owner_ = ShareOwners(*replicas_[0], size(), param_count_);
  shares_ = SharesOf(*replicas_[0], owner_, size());
  int64_t offset = 0;
  for (const ParamInfo& p : replicas_[0]->params()) {
    offset_.push_back(offset);
    offset += p.num_elements;
  }
}

absl::StatusOr<StepResult> ReplicaSet::TrainStep(const float* features, const int32_t* labels,
                                                 int64_t batch, int64_t step,
                                                 const TrainStepOptions& options) {
  const int n = static_cast<int>(std::min<int64_t>(size(), batch));
  // One replica, one example, or no batch at all (which TrainStep rejects).
  if (n <= 1) return primary()->TrainStep(features, labels, batch, step, options);
  const auto& gradient_queued = options.gradient_queued;
  const std::vector<int64_t> begin = SliceStarts(batch, n);
  // The communicators span every replica: a batch smaller than the set
  // (rare: a short last batch) takes the host path.
  if (nccl_ != nullptr && n == size()) {
    return TrainStepWithNccl(features, labels, step, begin, options);
  }
  // The host path trains on the whole host parameters: the caller's
  // parameters arriving, and its hook before backward, come first.
  if (options.await_layer_params) {
    const auto& layers = primary()->shape().layers;
    for (int layer = 0; layer < static_cast<int>(layers.size()); ++layer) {
      if (!layers[layer].param_ids.empty()) RETURN_IF_ERROR(options.await_layer_params(layer));
    }
  }
  if (options.before_backward) RETURN_IF_ERROR(options.before_backward());
  absl::StatusOr<StepResult> result = TrainStepOnHost(features, labels, step, begin);
  if (result.ok() && gradient_queued != nullptr) {
    for (int id = static_cast<int>(primary()->params().size()) - 1; id >= 0; --id) {
      gradient_queued(id, -1);
    }
  }
  return result;
}

absl::Status ReplicaSet::UploadParam(int id, int64_t offset, int64_t count) {
  if (size() == 1) return primary()->UploadParam(id, offset, count);
  if (nccl_ == nullptr) return absl::OkStatus();
  Model* to = replicas_[owner_[id]].get();
  RETURN_IF_ERROR(to->backend().MakeCurrent());  // The calling thread's device.
  return to->backend().UploadAside(to->device_param(id) + offset, primary()->param(id) + offset,
                                   sizeof(float) * count);
}

absl::Status ReplicaSet::WaitGradient(int id, int64_t ticket) {
  return replicas_[owner(id)]->WaitGradient(ticket);
}

std::vector<absl::StatusOr<StepResult>> ReplicaSet::TrainSlices(
    const float* features, const int32_t* labels, int64_t step, const std::vector<int64_t>& begin,
    const std::vector<TrainStepOptions>& options) {
  const int n = static_cast<int>(begin.size()) - 1;
  const int64_t feature_size = primary()->input_size();
  // The step number only seeds dropout masks: each replica gets its own
  // stream of them, so slices do not repeat one another's masks.
  auto train = [&](int r) {
    return replicas_[r]->TrainStep(features + begin[r] * feature_size, labels + begin[r],
                                   begin[r + 1] - begin[r], step * n + r,
                                   options.empty() ? TrainStepOptions() : options[r]);
  };
  std::vector<absl::StatusOr<StepResult>> results(n, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 1; r < n; ++r) {
    threads.emplace_back([&, r] { results[r] = train(r); });
  }
  results[0] = train(0);
  for (std::thread& t : threads) t.join();
  return results;
}

absl::StatusOr<StepResult> ReplicaSet::TrainStepOnHost(const float* features, const int32_t* labels,
                                                       int64_t step,
                                                       const std::vector<int64_t>& begin) {
  const int n = static_cast<int>(begin.size()) - 1;
  Model* primary = this->primary();
  const auto& params = primary->params();
  for (int r = 1; r < n; ++r) {
    for (const ParamInfo& p : params) {
      std::memcpy(replicas_[r]->param(p.id), primary->param(p.id), p.num_elements * sizeof(float));
    }
  }
  ASSIGN_OR_RETURN(StepResult total,
                   CombineSlices(TrainSlices(features, labels, step, begin, {}), begin));
  if (total.skipped) {
    ZeroGrads(primary);
    return total;
  }
  const std::vector<float> weights = SliceWeights(begin);
  for (const ParamInfo& p : params) {
    float* g = primary->grad(p.id);
    for (int64_t i = 0; i < p.num_elements; ++i) g[i] *= weights[0];
    for (int r = 1; r < n; ++r) {
      const float* gr = replicas_[r]->grad(p.id);
      for (int64_t i = 0; i < p.num_elements; ++i) g[i] += weights[r] * gr[i];
    }
  }
  return total;
}

// Every collective below is issued by this one thread for every replica at
// once (the device group groups them), and whether the reduce is issued at
// all is decided here after every slice has finished: so all ranks always
// issue the same collectives in the same order, and an error or a skipped
// step leaves none pending.
struct ReplicaSet::Overlap {
  // What a part done once for all replicas (a layer's gather, the hook
  // before backward) is at: kToDo, kRunning (on some replica's thread) or
  // kDone (with its status).
  enum { kToDo, kRunning, kDone };
  struct Once {
    int state = kToDo;
    absl::Status status;
  };

  const TrainStepOptions* options = nullptr;  // The caller's.
  std::vector<float*> params, grads;          // Each replica's device blocks.
  std::vector<float> weights;                 // Each slice's share of the batch.

  // The Onces' fields are guarded by mu (the vector is sized before the
  // replicas start).
  absl::Mutex mu;
  std::vector<Once> layers;
  Once before_backward;
  // Per param id, under collective_mu_: the replicas whose backward has
  // queued its gradient; the first failure of a reduce or copy.
  std::vector<int> arrived;
  absl::Status error;

  // Runs `part` on the first thread to ask and gives every asker its status,
  // the others waiting until it is done.
  absl::Status RunOnce(Once* once, const std::function<absl::Status()>& part) {
    mu.Lock();
    if (once->state == kToDo) {
      once->state = kRunning;
      mu.Unlock();
      absl::Status status = part();
      mu.Lock();
      once->status = std::move(status);
      once->state = kDone;
    } else {
      mu.Await(absl::Condition(
          +[](Once* o) { return o->state == kDone; }, once));
    }
    absl::Status status = once->status;
    mu.Unlock();
    return status;
  }
};

// Every collective below is issued by one thread for every replica at once
// (the device group groups them), under collective_mu_: all ranks see the
// same collectives in the same order. The whole-block ones are decided here
// after every slice has finished; the overlapped ones are issued only once
// every replica has reached them (a layer's gather: the replica that asks
// first; a tensor's reduce: the last replica whose backward produced it),
// so an error or a skipped step leaves none pending.
absl::StatusOr<StepResult> ReplicaSet::TrainStepWithNccl(const float* features,
                                                         const int32_t* labels, int64_t step,
                                                         const std::vector<int64_t>& begin,
                                                         const TrainStepOptions& options) {
  const int n = size();
  Model* primary = this->primary();
  Overlap overlap;
  overlap.options = &options;
  overlap.params.assign(n, nullptr);
  overlap.grads.assign(n, nullptr);
  for (int r = 0; r < n; ++r) {
    if (param_count_ > 0) {
      overlap.params[r] = replicas_[r]->device_param(0);
      overlap.grads[r] = replicas_[r]->device_grad(0);
    }
  }
  overlap.weights = SliceWeights(begin);
  overlap.arrived.assign(primary->params().size(), 0);
  overlap.layers.resize(primary->shape().layers.size());
  // Layer by layer as the parameters arrive (the caller's
  // await_layer_params), or the whole block first.
  const bool gather_by_layer = options.await_layer_params != nullptr;
  // Each gradient reduced and on its way to the host as soon as every
  // replica has it (not with FP16, whose verdict comes after the step).
  bool reduce_by_tensor = options.gradient_queued != nullptr;
  for (const auto& r : replicas_) reduce_by_tensor = reduce_by_tensor && r->precision() != FP16;

  if (!gather_by_layer) {
    // Each share up to its owner's device (unless UploadParam queued it
    // there already), on the copy streams side by side, then from every
    // owner to the other devices, queued on each replica's stream ahead of
    // its step.
    for (int r = 0; r < n; ++r) {
      kernels::ComputeBackend& backend = replicas_[r]->backend();
      RETURN_IF_ERROR(backend.MakeCurrent());
      const kernels::DeviceShare& share = shares_[r];
      if (options.params_from_host && share.count > 0) {
        RETURN_IF_ERROR(backend.UploadAside(overlap.params[r] + share.offset,
                                            primary->param(0) + share.offset,
                                            sizeof(float) * share.count));
      }
      RETURN_IF_ERROR(backend.JoinUploads());
    }
    absl::MutexLock lock(&collective_mu_);
    RETURN_IF_ERROR(nccl_->Broadcast(overlap.params, shares_));
  }

  std::vector<TrainStepOptions> per_replica(n);
  for (int r = 0; r < n; ++r) {
    TrainStepOptions& o = per_replica[r];
    o.params_from_host = false;
    o.grads_to_host = false;
    if (gather_by_layer) {
      o.await_layer_params = [this, &overlap, r](int layer) {
        return GatherLayer(overlap, layer, r);
      };
    }
    if (options.before_backward) {
      o.before_backward = [this, &overlap] { return BeforeBackward(overlap); };
    }
    if (reduce_by_tensor) {
      o.gradient_on_device = [this, &overlap, r](int id) { GradientOnDevice(overlap, id, r); };
    }
  }
  ASSIGN_OR_RETURN(StepResult total,
                   CombineSlices(TrainSlices(features, labels, step, begin, per_replica), begin));
  if (reduce_by_tensor) {
    RETURN_IF_ERROR(overlap.error);
    for (size_t id = 0; id < overlap.arrived.size(); ++id) {
      if (overlap.arrived[id] != n) {
        return absl::InternalError(absl::StrCat("the gradient of ", primary->params()[id].name,
                                                " came from ", overlap.arrived[id], " of ", n,
                                                " replicas"));
      }
    }
    return total;
  }
  if (total.skipped) {
    // No reduce: the step's gradients are zeros, whatever the replicas that
    // did not overflow computed.
    ZeroGrads(primary);
    if (options.gradient_queued) {
      for (int id = static_cast<int>(primary->params().size()) - 1; id >= 0; --id) {
        options.gradient_queued(id, -1);
      }
    }
    return total;
  }
  // The weights are applied on each device, inside the reduce.
  {
    absl::MutexLock lock(&collective_mu_);
    RETURN_IF_ERROR(nccl_->WeightedSum(overlap.grads, overlap.weights, shares_));
  }
  RETURN_IF_ERROR(SharesToHost(options.gradient_queued));
  return total;
}

void ReplicaSet::GradientOnDevice(Overlap& step, int id, int r) {
  absl::MutexLock lock(&collective_mu_);
  if (++step.arrived[id] < size() || !step.error.ok()) return;
  Model* owner = replicas_[owner_[id]].get();
  const int64_t count = primary()->params()[id].num_elements;
  absl::Status status = nccl_->WeightedSum(step.grads, step.weights,
                                           {kernels::DeviceShare{offset_[id], count, owner_[id]}});
  if (status.ok()) status = owner->backend().MakeCurrent();
  int64_t ticket = -1;
  if (status.ok()) {
    absl::StatusOr<int64_t> queued = owner->backend().DownloadAside(
        primary()->grad(id), owner->device_grad(id), sizeof(float) * count);
    if (queued.ok()) {
      ticket = *queued;
    } else {
      status = queued.status();
    }
  }
  if (status.ok()) {
    absl::MutexLock callbacks(&callbacks_mu_);
    step.options->gradient_queued(id, ticket);
  }
  // This thread goes on driving replica r's device.
  absl::Status back = replicas_[r]->backend().MakeCurrent();
  step.error = status.ok() ? back : status;
}

absl::Status ReplicaSet::GatherLayer(Overlap& step, int layer, int r) {
  return step.RunOnce(&step.layers[layer], [&]() -> absl::Status {
    {
      absl::MutexLock callbacks(&callbacks_mu_);
      RETURN_IF_ERROR(step.options->await_layer_params(layer));
    }
    // The layer's parameters are queued to their owners' copy streams:
    // each owner's stream waits for them, then they go to every device.
    std::vector<kernels::DeviceShare> shares;
    absl::MutexLock lock(&collective_mu_);
    std::set<int> owners;
    for (int id : primary()->shape().layers[layer].param_ids) {
      shares.push_back({offset_[id], primary()->params()[id].num_elements, owner_[id]});
      owners.insert(owner_[id]);
    }
    for (int owner : owners) {
      RETURN_IF_ERROR(replicas_[owner]->backend().MakeCurrent());
      RETURN_IF_ERROR(replicas_[owner]->backend().JoinUploads());
    }
    absl::Status broadcast = nccl_->Broadcast(step.params, shares);
    RETURN_IF_ERROR(replicas_[r]->backend().MakeCurrent());
    return broadcast;
  });
}

absl::Status ReplicaSet::BeforeBackward(Overlap& step) {
  return step.RunOnce(&step.before_backward, [&] {
    absl::MutexLock callbacks(&callbacks_mu_);
    return step.options->before_backward();
  });
}

absl::Status ReplicaSet::SharesToHost(const std::function<void(int, int64_t)>& queued) {
  Model* primary = this->primary();
  const int num_params = static_cast<int>(primary->params().size());
  // Each owner's copies go on its own download stream, after the reduce on
  // its compute stream; the first tensors first (the shards' pulls send
  // them back first, and the next forward needs them first).
  std::vector<std::vector<int64_t>> tickets(size());
  for (int r = 0; r < size(); ++r) {
    Model* from = replicas_[r].get();
    RETURN_IF_ERROR(from->backend().MakeCurrent());
    for (int id = 0; id < num_params; ++id) {
      if (owner_[id] != r) continue;
      ASSIGN_OR_RETURN(int64_t ticket, from->backend().DownloadAside(
                                           primary->grad(id), from->device_grad(id),
                                           sizeof(float) * primary->params()[id].num_elements));
      if (queued) {
        queued(id, ticket);
      } else {
        tickets[r].push_back(ticket);
      }
    }
  }
  for (int r = 0; r < size(); ++r) {
    for (int64_t ticket : tickets[r]) RETURN_IF_ERROR(replicas_[r]->WaitGradient(ticket));
  }
  return absl::OkStatus();
}

}  // namespace downpour
