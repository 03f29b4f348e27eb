// The one place gRPC status and absl::Status are converted (the edge).
#ifndef DOWNPOUR_RPC_GRPC_STATUS_H_
#define DOWNPOUR_RPC_GRPC_STATUS_H_

#include <chrono>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace downpour {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Sets a deadline `timeout` from now on `context`.
void SetDeadline(grpc::ClientContext* context, std::chrono::milliseconds timeout);

}  // namespace downpour

#endif  // DOWNPOUR_RPC_GRPC_STATUS_H_
