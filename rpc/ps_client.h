// RemoteParameterShard: a ParameterShard on another machine, reached over
// gRPC (the remote client of the three layers), so a worker cannot tell it
// from a local ParameterStore.
//
// Thread-safe: calls may be made concurrently from any thread. Shares
// ownership of its channel. Every call has a deadline; errors come back as
// absl::Status prefixed with the shard's address ("shard HOST:PORT: ...").
#ifndef DOWNPOUR_RPC_PS_CLIENT_H_
#define DOWNPOUR_RPC_PS_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/parameter_store.h"
#include "grpcpp/grpcpp.h"
#include "proto/parameter_server.grpc.pb.h"

namespace downpour {

class RemoteParameterShard final : public ParameterShard {
 public:
  struct Options {
    // Deadline of each Push.
    absl::Duration push_timeout = absl::Seconds(30);
    // Largest message received (a Pull of many partitions can be large).
    int max_message_bytes = 256 << 20;
  };

  // Connects (lazily, insecure credentials) to the shard at `address`
  // (HOST:PORT).
  static std::unique_ptr<RemoteParameterShard> Create(const std::string& address,
                                                      const Options& options);
  static std::unique_ptr<RemoteParameterShard> Create(const std::string& address) {
    return Create(address, Options());
  }

  // Uses an existing channel to `address` (named in errors).
  RemoteParameterShard(std::string address, std::shared_ptr<grpc::Channel> channel,
                       const Options& options);

  absl::StatusOr<PushResponse> Push(const PushRequest& request) override;
  // `deadline` becomes the call's gRPC deadline; the shard answers
  // DeadlineExceeded, naming what it waited for, shortly before it.
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline) override;

  const std::string& address() const { return address_; }

 private:
  const std::string address_;
  const Options options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ParameterServer::Stub> stub_;
};

}  // namespace downpour

#endif  // DOWNPOUR_RPC_PS_CLIENT_H_
