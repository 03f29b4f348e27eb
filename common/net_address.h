// HOST:PORT parsing for flags such as --listen and --coordinator.
#ifndef DOWNPOUR_COMMON_NET_ADDRESS_H_
#define DOWNPOUR_COMMON_NET_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"

namespace downpour {

struct HostPort {
  std::string host;
  int port = 0;
};

// Accepts "host:port", "[v6]:port" and ":port" (host 0.0.0.0); port 0..65535.
absl::StatusOr<HostPort> ParseHostPort(const std::string& text);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_NET_ADDRESS_H_
