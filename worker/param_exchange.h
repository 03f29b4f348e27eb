// ParameterExchange: the worker side of one training step's traffic with the
// parameter shards of a job — pushing gradient partitions and pulling the
// parameters back — shared by JobTrainer and the transport benchmark, so the
// benchmark measures exactly what training does.
//
// Partitions are grouped per shard into messages of at most
// `message_bytes`, and the messages of a push or pull run concurrently on a
// small pool of threads (`max_inflight`), over several connections per shard
// (RemoteParameterShard), so a shard receives, applies and answers several
// partitions at once. Pushes go out last layer first (the order backward
// produces them); pulls come back first layer first (the order the next
// forward needs them). Every push message carries its own
// (worker_id, incarnation, sequence), so one retried after a timeout or lost
// connection is applied once.
// PushPull does a step's push and the next step's pull in one round trip per
// message. BeginPushPull / GradientReady / FinishPushPull do the same while
// the gradients are still being computed: each message goes out as soon as
// the last of its tensors' gradients is ready (backward produces them last
// layer first), so the exchange overlaps the backward pass.
//
// Thread-compatible: one exchange belongs to one trainer; Push, Pull and
// PushPull are not called concurrently with each other. The shards are not owned and must
// outlive the exchange.
#ifndef DOWNPOUR_WORKER_PARAM_EXCHANGE_H_
#define DOWNPOUR_WORKER_PARAM_EXCHANGE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/payload.h"
#include "common/wire_dtype.h"
#include "proto/job.pb.h"
#include "ps/parameter_shard.h"

namespace downpour {

struct ExchangeOptions {
  std::string job_id;
  int rank = 0;
  // Exactly-once identity of this rank's exchange in this worker process
  // ("<node>#r<rank>": a node may train two ranks of a job).
  std::string worker_id;
  int64_t incarnation = 0;
  // Sequences start above this: a job started again (resumed, recovered) in
  // the same process starts above every sequence its last run used, which a
  // restored exactly-once window may hold.
  int64_t first_sequence = 0;
  // The start of the job this run belongs to (PushRequest.attempt).
  int64_t attempt = 0;
  // How long a pull may wait in total (other workers in SYNC, a shard coming
  // up) before it fails.
  absl::Duration pull_timeout = absl::Seconds(120);
  // A blocking pull is issued in slices of this length, so cancellation is
  // noticed.
  absl::Duration pull_slice = absl::Seconds(2);
  // How long a push message may take in all, retries of timed-out or lost
  // attempts included, before the push fails. One attempt is bounded by the
  // shard client's own deadline (RemoteParameterShard's
  // push_attempt_timeout); an attempt that fails sooner (a refused
  // connection) is retried within this.
  absl::Duration push_timeout = absl::Seconds(30);
  // Element type of gradients on the wire (kInt8: each message carries what
  // its last push's rounding dropped into the next).
  WireDtype gradient_dtype = WireDtype::kFloat32;
  // kInt8 (SYNC jobs, JobSpec.parameter_wire_dtype): pulls come back as int8
  // changes to the shards' published copies, which the host parameters then
  // hold (reduced_tensors is not used); kFloat32: as the values are.
  WireDtype parameter_dtype = WireDtype::kFloat32;
  // Tensors pulled as `reduced_dtype` (kBfloat16 or kFloat16) instead of
  // float32: those the model reads only through a copy in that type
  // (ModelRunner::reduced_weight_params), so their narrowed values give
  // the same step. They land widened to float32 in the host parameters.
  std::vector<int32_t> reduced_tensors;
  WireDtype reduced_dtype = WireDtype::kBfloat16;
  // Largest message, in float32 bytes (partitions are never split); 0:
  // chosen from the model's size, about 32 messages a step
  // (AutoMessageBytes).
  int64_t message_bytes = 0;
  // The most messages in flight at once (the exchange's threads). The
  // window, how many are, starts there; SetWindow moves it below.
  int max_inflight = 8;
  // What gives up a push under way, its retries included; null: the
  // call's `cancelled`, which gives up everything. Set, the call's
  // `cancelled` gives up only the waits for pulls: a worker shutting down
  // (drained) still pushes the step it computed to every shard, message by
  // message, and waits for no parameters, so its rank's step reaches every
  // partition or none and the rank's taker finds them all at one version
  // (it starts at the step every partition has reached). The trainer gives
  // a push up only when the job ended or the rank went elsewhere.
  std::function<bool()> push_cancelled;
  // Testing only (the worker's --testing_stall_mid_push): at this step the
  // messages to shards other than shard 0 are never sent and block for
  // good, and a line is logged once shard 0's are exchanged, so a worker
  // killed then has pushed the step to shard 0 alone. -1: never.
  int64_t testing_stall_step = -1;
  // Testing only (--testing_stall_mid_push=JOB:RANK:STEP:stale): the stalled
  // messages are pushed after all, 2 s after the step is cancelled (the
  // rank went elsewhere), as a worker cut off from the coordinator pushes
  // when its link to the shards returns; the outcome is logged.
  bool testing_stale_push = false;
};

// The message size for `total_bytes` of float32 parameters: total / 32,
// within [256 KiB, 4 MiB]. Smaller messages spread a step's exchange over
// more threads and connections on both sides (the shard receives, applies
// and answers them at once), at a fixed cost per message.
int64_t AutoMessageBytes(int64_t total_bytes);

class ParameterExchange {
 public:
  // `partitions` is the job's placement; `shards[i]` serves shard index i.
  ParameterExchange(ExchangeOptions options, const std::vector<PartitionPlacement>& partitions,
                    std::vector<ParameterShard*> shards);
  ~ParameterExchange();

  // Pushes the gradients of `step`: grads[tensor_id] points at the whole
  // tensor's gradient. Empty `grads` pushes the step as skipped (FP16 loss
  // scaling found a non-finite gradient): the shards count the step as
  // this worker's, with no gradient (PushRequest.skipped).
  // REQUIRES: grads is empty or every placed tensor has a pointer.
  absl::Status Push(
      int64_t step, const std::vector<const float*>& grads,
      const std::function<bool()>& cancelled = [] { return false; });

  // Pulls every partition into params[tensor_id] once the shards meet
  // (min_version, min_worker_steps); gives up when `cancelled` returns true.
  // `exact_version` (SYNC): every partition's values at min_version exactly,
  // also of one already a step past it (PullRequest.exact_version).
  absl::Status Pull(int64_t min_version, int64_t min_worker_steps,
                    const std::vector<float*>& params, const std::function<bool()>& cancelled,
                    bool exact_version = false);

  // Push(step, grads) then Pull(min_version, min_worker_steps, params) with
  // one round trip per message (ParameterShard::PushPull) where it can: a
  // worker's step boundary. Should a combined call time out or lose its
  // connection, the message finishes with a separate push (same request id,
  // so applied once) and pull, under the same push and pull timeouts.
  absl::Status PushPull(int64_t step, const std::vector<const float*>& grads, int64_t min_version,
                        int64_t min_worker_steps, const std::vector<float*>& params,
                        const std::function<bool()>& cancelled);

  // PushPull(step, grads, min_version, min_worker_steps, params) with each
  // message sent once GradientReady has been called for each of its
  // tensors: BeginPushPull starts the step (nothing is sent yet);
  // GradientReady(id, wait) says tensor id's gradient is in grads[id] once
  // wait() returns OK (called on the exchange's threads before the message
  // goes; an error fails the step); FinishPushPull waits for every message
  // and returns the first error. `abandon`: the step failed before all its
  // gradients were ready; messages not yet released are never sent.
  // `pulled`, when set, is called on an exchange thread for each partition
  // once its values are in params (a GPU trainer queues them to the device
  // there); an error fails the step. grads, params and cancelled must
  // outlive FinishPushPull.
  // REQUIRES: grads has a pointer for every tensor; no other call between
  // BeginPushPull and FinishPushPull but GradientReady; min_worker_steps <=
  // step (a pull waiting for this step's own pushes would hold its message's
  // place in the window; PushPull pushes first for those).
  using PulledFn = std::function<absl::Status(const PartitionPlacement&)>;
  void BeginPushPull(int64_t step, const std::vector<const float*>& grads, int64_t min_version,
                     int64_t min_worker_steps, const std::vector<float*>& params,
                     const std::function<bool()>& cancelled, PulledFn pulled = nullptr);
  void GradientReady(int tensor_id, std::function<absl::Status()> wait);
  // Blocks until every message holding a partition of these tensors has
  // been exchanged (its values in params, `pulled` called) in the streamed
  // step in flight, or until some message of it failed (its error). The
  // next step's forward waits here layer by layer, so it starts on the
  // first layers while the rest are still coming back.
  absl::Status AwaitTensors(const std::vector<int32_t>& tensor_ids);
  absl::Status FinishPushPull(bool abandon = false);

  // How many messages may be in flight at once from now on, within
  // [1, max_inflight] (worker/exchange_window.h chooses it), and one more:
  // the lowest not finished (see CanRun). Messages already running finish;
  // the next start when fewer than `depth` run.
  void SetWindow(int depth) ABSL_LOCKS_EXCLUDED(mu_);
  int window() const ABSL_LOCKS_EXCLUDED(mu_);

  // Checkpoints (rank 0). MarkNextPush(S): the next Push or PushPull asks
  // every shard to capture its partitions for a checkpoint at step S
  // (PushRequest.checkpoint_step). CaptureNow(S, last_step): the same
  // without gradients, one empty push per shard (after the last step, for
  // the final checkpoint), counted as part of `last_step`.
  void MarkNextPush(int64_t checkpoint_step) { checkpoint_step_ = checkpoint_step; }
  absl::Status CaptureNow(int64_t checkpoint_step, int64_t last_step,
                          const std::function<bool()>& cancelled);

  // The lowest partition version the last pull returned (Pull's, or a
  // push's that pulls too). SYNC: the step
  // every partition has reached — a worker joining a running job starts
  // there, so a step the lost worker pushed to some partitions only (it died
  // mid-push) is completed on the others, while those already past it take
  // the repeated push as late: each partition applies each step once.
  int64_t min_pulled_version() const { return min_pulled_version_.load(); }

  // The push-and-pull exchanges (a streamed step's, or PushPull's), summed
  // over those that completed: from the first message's gradients ready
  // (its wait returned) to the last message's parameters back, and from the
  // last message's gradients ready (backward's last) to then: what of the
  // round trip the next forward may find still under way.
  struct StreamedSeconds {
    int64_t steps = 0;  // Exchanges summed.
    double from_first_ready = 0, from_last_ready = 0;
    // The message done last: its round trip (from its request's sending to
    // its answer) and how long its shard held it (PushPullResponse.handled_us),
    // where it was answered in one round trip by a shard that says so.
    double last_round_trip = 0, last_on_shard = 0;
  };
  StreamedSeconds streamed_seconds() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Message {
    int shard;
    std::vector<PartitionPlacement> partitions;
    std::vector<char> encoded;  // Gradients in a narrow wire dtype.
    // Int8 gradients: what each element's rounding dropped, added to the
    // next push (one float per element of the message's partitions).
    std::vector<float> carry;
    // Its tensors of ExchangeOptions::reduced_tensors, pulled narrowed.
    std::vector<int32_t> reduced;
    // Int8 pulls: the published copy the host parameters hold of each
    // partition, (lineage, version); lineage 0: none (the next pull takes
    // the copy whole).
    std::vector<uint64_t> held_lineage;
    std::vector<int64_t> held_version;
  };

  // Message i's requests; the push's payload points at `grads` (or at the
  // message's encoded buffer); empty `grads`: a skipped push.
  PushRequest MakePushRequest(int i, int64_t step, int64_t sequence,
                              const std::vector<const float*>& grads, Payload* payload);
  PullRequest MakePullRequest(int i, int64_t min_version, int64_t min_worker_steps,
                              bool exact_version = false) const;
  // What gives up a push of a call given `cancelled`
  // (ExchangeOptions::push_cancelled).
  const std::function<bool()>& PushCancelled(const std::function<bool()>& cancelled) const {
    return options_.push_cancelled ? options_.push_cancelled : cancelled;
  }
  // Sends message i's push, retried as worker/shard_retry.h says until
  // `give_up` or PushCancelled(cancelled).
  absl::Status SendPush(int i, const PushRequest& request, const Payload& payload,
                        absl::Time give_up, const std::function<bool()>& cancelled);
  // Pulls message i in slices of pull_slice (worker/shard_retry.h) until
  // `give_up`, into `params`.
  absl::Status ReceivePull(int i, const PullRequest& request, absl::Time give_up,
                           const std::vector<float*>& params,
                           const std::function<bool()>& cancelled);
  // Checks a pull's answer for message i and copies it into `params`;
  // `exact_version` >= 0: every partition must be at that version (an
  // exact pull; FailedPrecondition otherwise).
  absl::Status CopyPulled(int i, const PullResponse& response, const Payload& payload,
                          const std::vector<float*>& params, int64_t exact_version = -1);

  // When a message went and came back (MonotonicSeconds) and how long its
  // shard held it.
  // A message's exchange (MonotonicSeconds; 0: not known): its gradients
  // ready and its parameters back (`done`), and, of an answered push-pull,
  // its request's sending, its answer and how long its shard held it.
  struct MessageTimes {
    double ready = 0, done = 0;
    double sent = 0, answered = 0, handled = 0;
  };
  // Message i's push and pull in one round trip (PushPull's and a streamed
  // step's), falling back to separate calls on a timeout or lost connection.
  absl::Status ExchangeMessage(int i, int64_t step, int64_t sequence,
                               const std::vector<const float*>& grads, int64_t min_version,
                               int64_t min_worker_steps, absl::Time push_give_up,
                               absl::Time pull_give_up, const std::vector<float*>& params,
                               const std::function<bool()>& cancelled,
                               const PulledFn* pulled = nullptr, MessageTimes* times = nullptr);
  // Runs task(i) for every i in [0, n) on the pool (and the calling thread),
  // starting them in order of i; returns the first error.
  absl::Status RunAll(int n, const std::function<absl::Status(int)>& task);
  // The pool runs task_ on each index queued, lowest first; Drain waits (helping
  // with the queue) until `pending_` is 0 and returns the first error.
  void Queue(int i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a queued task may start: the queue holds one, and fewer than
  // the window run or it is the lowest task not finished. That exception
  // (at most one beyond the window) keeps SYNC workers whose windows hold
  // different messages from waiting on each other for good: a message
  // completes only once every worker pushed it, and the lowest message not
  // complete is one every worker may start.
  bool CanRun() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() && (running_ < window_ || queue_.top() == finished_prefix_);
  }
  // Takes the lowest queued index and runs task_ on it outside the lock.
  // REQUIRES: CanRun().
  void RunNext() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Drain() ABSL_LOCKS_EXCLUDED(mu_);
  void PoolLoop();

  const ExchangeOptions options_;
  const std::vector<ParameterShard*> shards_;
  std::vector<Message> messages_;  // Sorted by (first tensor, partition).
  std::vector<int> partitions_per_shard_;
  int64_t sequence_ = 0;
  mutable std::atomic<int64_t> min_pulled_version_{0};
  int64_t checkpoint_step_ = 0;  // For the next push's requests (0: none).
  // FinishPushPull(abandon) is draining: the step's messages wait for no
  // parameters.
  std::atomic<bool> abandoning_{false};
  // Shard 0's messages of testing_stall_step not yet exchanged.
  std::atomic<int> testing_left_{0};

  // Per tensor id, the messages holding its partitions; per message, how
  // many distinct tensors it holds.
  std::vector<std::vector<int>> messages_of_tensor_;
  std::vector<int> tensors_in_message_;

  mutable absl::Mutex mu_;
  // Shared with the tasks running it: a message is not a copy of the step's
  // state (its pointers and callbacks).
  std::shared_ptr<const std::function<absl::Status(int)>> task_ ABSL_GUARDED_BY(mu_);
  // Queued tasks, lowest index first: of a streamed step's messages ready
  // at once, the first layers' go first (the next forward needs them
  // first), as in P3 / BytePS priority scheduling.
  std::priority_queue<int, std::vector<int>, std::greater<int>> queue_ ABSL_GUARDED_BY(mu_);
  // Tasks of the current batch not yet finished (queued, running, or still
  // to be released by GradientReady).
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  // Tasks running (on the pool or a helping caller), and how many may.
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int window_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  // A streamed step: per message, its tensors not yet ready and the wait of
  // the last one released; whether any message is still unreleased.
  std::vector<int> unready_ ABSL_GUARDED_BY(mu_);
  // Per task of the current batch (RunAll, BeginPushPull): it has returned.
  std::vector<bool> finished_ ABSL_GUARDED_BY(mu_);
  // How many of the current batch's first tasks have finished.
  int finished_prefix_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::function<absl::Status()>> ready_wait_ ABSL_GUARDED_BY(mu_);
  int unreleased_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The streamed step in flight: per message, its times, written by its
  // own task only (sized by BeginPushPull, read once Drain has seen every
  // task return); and the sums.
  std::vector<MessageTimes> message_times_;
  StreamedSeconds streamed_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pool_;
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_PARAM_EXCHANGE_H_
