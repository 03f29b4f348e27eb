// downpourctl nodes: list the nodes; drain (cordon) and uncordon one.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/commands.h"
#include "client/output.h"
#include "proto/coordinator.pb.h"

namespace downpour {
namespace {

// "alive", "draining", "cordoned", "dead": what an operator asks first.
std::string NodeStatus(const NodeInfo& node) {
  if (!node.alive()) return "dead";
  if (node.cordoned()) return "cordoned";
  if (node.draining()) return "draining";
  return "alive";
}

int ListNodes(const CtlOptions& options) {
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<std::vector<NodeInfo>> nodes = (*client)->ListNodes();
  if (!nodes.ok()) return FailStatus(nodes.status());
  if (PrintsMessages(options.output)) {
    PrintMessages(*nodes, options.output);
    return kExitOk;
  }
  const bool wide = options.output == OutputFormat::kWide;
  const int64_t now = NowMs();
  std::vector<std::vector<std::string>> rows;
  for (const NodeInfo& node : *nodes) {
    const std::string devices = absl::StrJoin(node.devices(), ",");
    // A dead node's last heartbeat is when it was last heard from.
    rows.push_back({node.id(), NodeRole_Name(node.role()), node.address(), NodeStatus(node),
                    Ago(node.last_heartbeat_ms(), now), devices.empty() ? "-" : devices});
    if (wide) {
      rows.back().push_back(node.hostname().empty() ? "-" : node.hostname());
      rows.back().push_back(node.metrics_address().empty() ? "-" : node.metrics_address());
      rows.back().push_back(absl::StrCat(node.incarnation()));
      rows.back().push_back(node.checkpoints() ? "yes" : "no");
    }
  }
  std::vector<std::string> header = {"ID",     "ROLE",           "ADDRESS",
                                     "STATUS", "LAST_HEARTBEAT", "DEVICES"};
  if (wide) header.insert(header.end(), {"HOSTNAME", "METRICS", "INCARNATION", "CHECKPOINTS"});
  PrintTable(header, rows);
  return kExitOk;
}

int Cordon(const CtlOptions& options, const std::string& node_id, bool cordoned) {
  absl::StatusOr<std::unique_ptr<RemoteCoordinator>> client = ConnectTo(options);
  if (!client.ok()) return FailStatus(client.status());
  absl::StatusOr<NodeInfo> node = (*client)->CordonNode(node_id, cordoned);
  if (!node.ok()) return FailStatus(node.status());
  if (PrintsMessages(options.output)) {
    PrintMessage(*node, options.output);
  } else if (cordoned) {
    std::cout << "node " << node->id()
              << " drained: it gets no new work, and its running jobs move to other nodes"
              << std::endl;
  } else {
    std::cout << "node " << node->id() << " uncordoned: it takes new work" << std::endl;
  }
  return kExitOk;
}

}  // namespace

int RunNodes(const CtlOptions& options, const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "list") {
    if (args.size() > 1) return UsageError("nodes list takes no arguments");
    return ListNodes(options);
  }
  const std::string& verb = args[0];
  if (verb == "drain" || verb == "uncordon") {
    if (args.size() != 2) {
      return UsageError(absl::StrCat(
          "nodes ", verb, " needs exactly one node id: downpourctl nodes ", verb, " NODE"));
    }
    return Cordon(options, args[1], verb == "drain");
  }
  return UsageError(absl::StrCat("unknown nodes subcommand '", verb,
                                 "'; use nodes, nodes drain NODE or nodes uncordon NODE"));
}

}  // namespace downpour
