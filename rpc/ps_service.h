// ParameterServerService: the gRPC face of a ParameterShard (the server
// adapter of the three layers; the logic lives in core/parameter_store).
//
// Thread-safe (the shard is). Does not own the shard, which must outlive the
// service. A Pull waits on the handling thread until its condition holds or
// the call's deadline (capped at Options::max_pull_wait) passes; the server's
// thread pool must allow for as many concurrent waiting pulls as workers.
#ifndef DOWNPOUR_RPC_PS_SERVICE_H_
#define DOWNPOUR_RPC_PS_SERVICE_H_

#include "absl/time/time.h"
#include "core/parameter_store.h"
#include "grpcpp/grpcpp.h"
#include "proto/parameter_server.grpc.pb.h"

namespace downpour {

class ParameterServerService final : public ParameterServer::Service {
 public:
  struct Options {
    // Longest a Pull waits, whatever (or without) the caller's deadline.
    absl::Duration max_pull_wait = absl::Seconds(60);
  };

  explicit ParameterServerService(ParameterShard* shard) : ParameterServerService(shard, {}) {}
  ParameterServerService(ParameterShard* shard, Options options);

  grpc::Status Push(grpc::ServerContext* context, const PushRequest* request,
                    PushResponse* response) override;
  grpc::Status Pull(grpc::ServerContext* context, const PullRequest* request,
                    PullResponse* response) override;

 private:
  ParameterShard* const shard_;
  const Options options_;
};

}  // namespace downpour

#endif  // DOWNPOUR_RPC_PS_SERVICE_H_
