#include "rpc/node_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "rpc/security_flags.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "gRPC address HOST:PORT (port 0 picks one)");
ABSL_FLAG(std::string, advertise, "",
          "Address other machines reach this daemon at, registered with the coordinator: "
          "HOST:PORT, or HOST for the bound port (default: the --listen address; on a wildcard "
          "such as 0.0.0.0, this machine's name)");
ABSL_FLAG(std::string, port_file, "", "File to write the bound HOST:PORT to once serving");
ABSL_FLAG(std::string, metrics_listen, "", "HTTP address for /metrics (empty: off)");
ABSL_FLAG(std::string, coordinator, "", "Coordinator HOST:PORT (required)");
ABSL_FLAG(int64_t, coordinator_timeout_ms, 30000,
          "Start-up fails unless the coordinator accepts the registration within this");
ABSL_FLAG(std::string, node_id, "",
          "Stable node name (default: ps@<listen address> or worker@<listen address>)");

namespace downpour {

NodeDaemon::Options NodeDaemonOptionsFromFlags(NodeRole role) {
  NodeDaemon::Options options;
  options.role = role;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.advertise = absl::GetFlag(FLAGS_advertise);
  options.port_file = absl::GetFlag(FLAGS_port_file);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.coordinator_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_coordinator_timeout_ms));
  options.node_id = absl::GetFlag(FLAGS_node_id);
  options.security = SecurityOptionsFromFlags();
  return options;
}

}  // namespace downpour
