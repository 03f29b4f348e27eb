// Keepalive between a worker and its shards: while calls are open the
// client pings every 2 s, and a ping unanswered within 10 s ends the
// connection and its calls (10 s, not less: a busy host may answer late). A
// shard whose host or link is gone sends no reset; without the pings a call
// whose bytes sat unsent there lasted until its deadline even once
// cancelled (gRPC completes a call only when its write is done), holding a
// stopped run (and the worker's exit) for up to the push timeout. Servers
// must accept pings that often: by default gRPC closes a connection that
// pings more than every 5 minutes while the server sends nothing (a pull
// waiting for other workers).
//
// Functions only; thread-safe.
#ifndef DOWNPOUR_RPC_KEEPALIVE_H_
#define DOWNPOUR_RPC_KEEPALIVE_H_

#include "grpcpp/grpcpp.h"

namespace downpour {

inline void SetClientKeepalive(grpc::ChannelArguments* args) {
  args->SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
  args->SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  // Pings go on however long a call sends nothing.
  args->SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

inline void AcceptClientKeepalive(grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

}  // namespace downpour

#endif  // DOWNPOUR_RPC_KEEPALIVE_H_
