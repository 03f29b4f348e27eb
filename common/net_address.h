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

// Whether `host` is a wildcard listen address (0.0.0.0, ::): every
// interface, reachable by no one at that name.
bool IsWildcardHost(const std::string& host);

// Whether `host` names this machine's loopback interface only (localhost,
// 127.0.0.0/8, ::1): what only local processes can reach.
bool IsLoopbackHost(const std::string& host);

// Whether `host`, a numeric IPv4 or IPv6 address (an IPv4-mapped IPv6 one,
// a zone such as %eth0 ignored), is this host's: loopback, or held by one
// of the interfaces of this process's network namespace. False for a name
// or anything that does not parse.
bool IsThisHostAddress(const std::string& host);

// "HOST:PORT", with brackets around an IPv6 host.
std::string JoinHostPort(const std::string& host, int port);

// The address other processes reach a daemon at, for its registration:
// `advertise` when given ("HOST:PORT", or "HOST" or "HOST:0" for the port it
// bound), else the address it listens on with a wildcard host replaced by
// `hostname` (the machine's name). InvalidArgument for a malformed
// `advertise`, a wildcard one, or a wildcard listen host with no hostname.
absl::StatusOr<std::string> AdvertisedAddress(const std::string& advertise,
                                              const std::string& listen_host, int bound_port,
                                              const std::string& hostname);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_NET_ADDRESS_H_
