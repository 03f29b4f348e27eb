// The flags a shard and a worker daemon share (--listen, --advertise, --port_file,
// --metrics_listen, --coordinator, --coordinator_timeout_ms, --node_id),
// defined once and read once, in main, into NodeDaemon::Options. Only the
// shard and worker binaries link this (the coordinator's --listen differs).
#ifndef DOWNPOUR_RPC_NODE_FLAGS_H_
#define DOWNPOUR_RPC_NODE_FLAGS_H_

#include "proto/coordinator.pb.h"
#include "rpc/daemon.h"

namespace downpour {

// The parsed flags as a node of `role`.
NodeDaemon::Options NodeDaemonOptionsFromFlags(NodeRole role);

}  // namespace downpour

#endif  // DOWNPOUR_RPC_NODE_FLAGS_H_
