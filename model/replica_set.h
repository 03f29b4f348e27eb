// ReplicaSet: data parallelism inside one worker, one model replica per local
// device. Each step's batch is split into contiguous slices, one per replica;
// each replica runs forward and backward on its slice from its own thread
// (driving its own device), and the batch-mean gradient ends in replica 0's
// grad(): replica 0 is the one that exchanges with the parameter shards and
// evaluates.
//
// How parameters reach the replicas and gradients come back:
// - Two or more replicas, each on its own GPU: NCCL (a kernels::DeviceGroup
//   over the replicas' backends). The parameters are cut into one share
//   per replica (whole tensors, contiguous, about equal in bytes), and each
//   replica moves its own share between the host and its device, so every
//   GPU's link carries a part of the traffic:
//   - parameters: each share goes up from replica 0's host copy to its
//     owner's device (or is already there: UploadParam, as parameters
//     arrive from the shards), then every share is broadcast from its owner
//     to the other devices (an all-gather);
//   - gradients: each replica trains on those device-resident parameters
//     and leaves its gradient on its device; a reduce-scatter (one reduce
//     per share, into its owner, each replica's gradient pre-multiplied by
//     its share of the batch) forms the batch mean, and each owner copies
//     its share of it into replica 0's host grad(), streaming each tensor
//     to the exchange as it lands where the step asks (gradient_queued).
// - Otherwise (replicas on the CPU, CPU and GPU mixed, two on one GPU, or
//   NCCL failed to start, which is logged): on the host. Replica 0's host
//   parameters are copied into the others', each replica's TrainStep moves
//   its own parameters and gradients, and the gradients are averaged on the
//   host, weighted by slice.
// Either way only replica 0's host param() and grad() are meaningful: on the
// NCCL path the other replicas' host copies are never refreshed.
//
// Thread safety: thread-compatible (TrainStep is called from one thread at a
// time; it starts and joins its own threads). Owns the replicas and, where
// used, the device group.
#ifndef DOWNPOUR_MODEL_REPLICA_SET_H_
#define DOWNPOUR_MODEL_REPLICA_SET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"
#include "model/model.h"

namespace downpour {

class ReplicaSet {
 public:
  // Takes the replicas; replica 0 is primary(). With two or more on distinct
  // GPUs it sets up NCCL over them, and falls back to the host path (and
  // logs why) if that fails. InvalidArgument for no replica or replicas of
  // different parameter shapes.
  static absl::StatusOr<std::unique_ptr<ReplicaSet>> Create(
      std::vector<std::unique_ptr<Model>> replicas);

  ReplicaSet(const ReplicaSet&) = delete;
  ReplicaSet& operator=(const ReplicaSet&) = delete;

  int size() const { return static_cast<int>(replicas_.size()); }
  // REQUIRES: 0 <= r < size().
  Model* replica(int r) const { return replicas_[r].get(); }
  Model* primary() const { return replicas_[0].get(); }
  // Whether steps over every replica reduce on the GPUs (see the top).
  bool reduces_with_nccl() const { return nccl_ != nullptr; }

  // Trains `batch` examples split into contiguous slices (replica r takes
  // [batch * r / n, batch * (r + 1) / n) of n = min(size(), batch)
  // replicas) from replica 0's host parameters, and leaves the batch-mean
  // gradient in primary()->grad(). The loss is the batch mean and `correct`
  // the batch's count; loss_scale is replica 0's. If any replica's FP16 step
  // overflowed, the step is skipped and primary()'s gradients are zeros.
  // Each replica's own local state (batch-norm statistics) moves with its
  // slice. Errors are the first failing replica's, or the NCCL call's; after
  // one, no collective is left pending.
  // `options`: with one replica, as Model::TrainStep takes them. With
  // several, the gradients go to primary()'s grad(id), announced to
  // options.gradient_queued as each is queued there (wait with
  // WaitGradient; ticket -1: already there); with NCCL the parameters come
  // from primary()'s host copy unless options.params_from_host is false,
  // which says every share was queued to its owner with UploadParam since
  // the last step (on the host path they always come from the host copy).
  // await_layer_params and before_backward are called as for one replica:
  // with NCCL, each layer awaited once (by the first replica to need it, its
  // parameters then broadcast from their owners) and the hook run once
  // before any replica's backward; on the host path, every layer awaited
  // and the hook run before the step. grads_to_host is for one replica.
  absl::StatusOr<StepResult> TrainStep(const float* features, const int32_t* labels, int64_t batch,
                                       int64_t step, const TrainStepOptions& options = {});

  // Queues elements [offset, offset + count) of primary()'s host param(id)
  // to the device that holds that parameter's share: primary()'s alone
  // with one replica (Model::UploadParam), its owner's with NCCL (and a
  // no-op on the host path, which reads the host copy). Thread-safe against
  // other UploadParam calls, as Model's.
  absl::Status UploadParam(int id, int64_t offset, int64_t count);
  // Waits until the gradient of param `id` that TrainStep announced with
  // `ticket` is in primary()->grad(id) (Model::WaitGradient on the replica
  // that copied it). Thread-safe.
  absl::Status WaitGradient(int id, int64_t ticket);
  // The replica whose device moves param `id` to and from the host.
  int owner(int id) const { return owner_.empty() ? 0 : owner_[id]; }

 private:
  ReplicaSet(std::vector<std::unique_ptr<Model>> replicas,
             std::unique_ptr<kernels::DeviceGroup> nccl);

  // What the replicas' threads share during one NCCL step whose
  // collectives overlap the replicas' compute (replica_set.cc).
  struct Overlap;

  // Runs replica r's TrainStep on slice r with options[r] (or default ones
  // where options is empty), r in [0, begin.size() - 1), each from its own
  // thread (replica 0 from this one), and waits for all.
  std::vector<absl::StatusOr<StepResult>> TrainSlices(const float* features, const int32_t* labels,
                                                      int64_t step,
                                                      const std::vector<int64_t>& begin,
                                                      const std::vector<TrainStepOptions>& options);
  absl::StatusOr<StepResult> TrainStepOnHost(const float* features, const int32_t* labels,
                                             int64_t step, const std::vector<int64_t>& begin);
  absl::StatusOr<StepResult> TrainStepWithNccl(const float* features, const int32_t* labels,
                                               int64_t step, const std::vector<int64_t>& begin,
                                               const TrainStepOptions& options);
  // The gradient's shares from their owners' devices to primary()'s host
  // grad(), each tensor announced to `queued` when set (else waited for).
  absl::Status SharesToHost(const std::function<void(int, int64_t)>& queued);
  // The overlapped step's parts, each called from a replica's thread
  // (replica r's): the gradient of param `id` is queued on replica r's
  // device (the last replica to get there reduces it into its owner and
  // queues it to the host); layer `layer`'s parameters are wanted (the
  // first replica to want them awaits them and broadcasts them from their
  // owners); the step's backward is about to start (once for all).
  void GradientOnDevice(Overlap& step, int id, int r);
  absl::Status GatherLayer(Overlap& step, int layer, int r);
  absl::Status BeforeBackward(Overlap& step);

  const std::vector<std::unique_ptr<Model>> replicas_;
  const int64_t param_count_;  // Floats in one replica's parameter block.
  // With NCCL: the replicas' shares of the parameter block, and the owner
  // of each param id; empty otherwise.
  std::vector<kernels::DeviceShare> shares_;
  std::vector<int> owner_;
  std::vector<int64_t> offset_;  // Of each param id in the block.
  // Held to issue a collective: one thread at a time drives the
  // communicators, so every rank sees them in one order.
  absl::Mutex collective_mu_;
  // Held around the caller's callbacks (await_layer_params, before_backward,
  // gradient_queued) when replicas' threads call them: one at a time, as
  // from one thread.
  absl::Mutex callbacks_mu_;
  // Declared after the replicas, so the communicators go first.
  std::unique_ptr<kernels::DeviceGroup> nccl_;
};

}  // namespace downpour

#endif  // DOWNPOUR_MODEL_REPLICA_SET_H_
