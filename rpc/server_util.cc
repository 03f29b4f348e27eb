#include "rpc/server_util.h"

#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/net_address.h"
#include "grpcpp/health_check_service_interface.h"

namespace downpour {

absl::StatusOr<RunningServer> StartGrpcServer(const std::string& listen,
                                              const std::vector<grpc::Service*>& services,
                                              int max_message_bytes) {
  auto parsed = ParseHostPort(listen);
  if (!parsed.ok()) return parsed.status();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  // gRPC sets SO_REUSEPORT by default, which would let a second daemon share
  // a busy port silently; an address in use must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(max_message_bytes);
  builder.SetMaxSendMessageSize(max_message_bytes);
  // Large HTTP/2 frames and windows: tensor messages are megabytes.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 20);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  for (grpc::Service* service : services) builder.RegisterService(service);
  RunningServer running;
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, " (address in use or not local)"));
  }
  running.address = absl::StrCat(parsed->host == "0.0.0.0" ? "127.0.0.1" : parsed->host, ":", port);
  return running;
}

absl::Status WritePortFile(const std::string& path, const std::string& address) {
  if (path.empty()) return absl::OkStatus();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << address << "\n";
    if (!out.good()) {
      return absl::FailedPreconditionError(absl::StrCat("cannot write port file ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write port file ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

std::string WaitForTerminationSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int signal = 0;
  while (sigwait(&set, &signal) != 0) {
  }
  return signal == SIGTERM ? "SIGTERM" : "SIGINT";
}

}  // namespace downpour
