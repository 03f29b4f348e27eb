// SlowShard (tests): a shard in front of another that answers each
// exchange `delay` late and says it spent `handled` on it
// (PushPullResponse.handled_us), as a remote shard's service does; pushes
// and pulls alone pass straight through.
#ifndef DOWNPOUR_WORKER_SLOW_SHARD_FOR_TESTS_H_
#define DOWNPOUR_WORKER_SLOW_SHARD_FOR_TESTS_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ps/parameter_shard.h"

namespace downpour {

class SlowShard final : public ParameterShard {
 public:
  SlowShard(ParameterShard* inner, absl::Duration delay, absl::Duration handled)
      : inner_(inner), delay_(delay), handled_(handled) {}
  using ParameterShard::Pull;
  using ParameterShard::Push;
  absl::StatusOr<PushResponse> Push(const PushRequest& request, const Payload& payload) override {
    return inner_->Push(request, payload);
  }
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline,
                                    Payload* payload) override {
    return inner_->Pull(request, deadline, payload);
  }
  absl::StatusOr<PushPullResponse> PushPull(const PushRequest& push, const Payload& push_payload,
                                            const PullRequest& pull, absl::Time deadline,
                                            Payload* pull_payload) override {
    absl::SleepFor(delay_);
    absl::StatusOr<PushPullResponse> answer =
        inner_->PushPull(push, push_payload, pull, deadline, pull_payload);
    if (answer.ok()) answer->set_handled_us(absl::ToInt64Microseconds(handled_));
    return answer;
  }

 private:
  ParameterShard* const inner_;
  const absl::Duration delay_, handled_;
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_SLOW_SHARD_FOR_TESTS_H_
