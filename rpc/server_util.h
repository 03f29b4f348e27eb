// What every Downpour daemon does around its gRPC services: bind --listen
// (port 0 picks a free port), serve grpc.health.v1, write --port_file once
// serving, serve /metrics, and wait for SIGTERM/SIGINT.
#ifndef DOWNPOUR_RPC_SERVER_UTIL_H_
#define DOWNPOUR_RPC_SERVER_UTIL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace downpour {

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  // HOST:PORT actually bound.
  std::string address;
};

// Builds and starts a server on `listen` with `services` (not owned) and the
// standard health service. Messages up to `max_message_bytes` are accepted.
absl::StatusOr<RunningServer> StartGrpcServer(const std::string& listen,
                                              const std::vector<grpc::Service*>& services,
                                              int max_message_bytes = 256 << 20);

// Writes `address` to `path` atomically (temp file + rename). No-op when
// `path` is empty.
absl::Status WritePortFile(const std::string& path, const std::string& address);

// Blocks SIGTERM and SIGINT in the calling thread; call first thing in main,
// before any thread starts, so every thread inherits the mask.
void BlockTerminationSignals();

// Waits for SIGTERM or SIGINT (blocked by BlockTerminationSignals) and
// returns its name.
std::string WaitForTerminationSignal();

}  // namespace downpour

#endif  // DOWNPOUR_RPC_SERVER_UTIL_H_
