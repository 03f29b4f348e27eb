#include "common/net_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace downpour {

absl::StatusOr<HostPort> ParseHostPort(const std::string& text) {
  const size_t colon = text.rfind(':');
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad address \"", text, "\": ", why, " (expected HOST:PORT)"));
  };
  if (colon == std::string::npos) return bad("no port");
  HostPort result;
  result.host = text.substr(0, colon);
  if (result.host.size() >= 2 && result.host.front() == '[' && result.host.back() == ']') {
    result.host = result.host.substr(1, result.host.size() - 2);
  }
  if (result.host.empty()) result.host = "0.0.0.0";
  if (!absl::SimpleAtoi(text.substr(colon + 1), &result.port) || result.port < 0 ||
      result.port > 65535) {
    return bad("port must be a number from 0 to 65535");
  }
  return result;
}

bool IsWildcardHost(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || absl::StartsWith(host, "127.");
}

bool IsThisHostAddress(const std::string& host) {
  const std::string address = host.substr(0, host.find('%'));
  unsigned char wanted[sizeof(in6_addr)] = {};
  bool v4 = inet_pton(AF_INET, address.c_str(), wanted) == 1;
  if (!v4) {
    if (inet_pton(AF_INET6, address.c_str(), wanted) != 1) return false;
    static const unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(wanted, kMapped, sizeof(kMapped)) == 0) {
      std::memmove(wanted, wanted + 12, sizeof(in_addr));
      v4 = true;
    } else if (IN6_IS_ADDR_LOOPBACK(reinterpret_cast<const in6_addr*>(wanted))) {
      return true;
    }
  }
  if (v4 && wanted[0] == 127) return true;
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return false;
  bool found = false;
  for (const ifaddrs* i = interfaces; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (v4 && i->ifa_addr->sa_family == AF_INET) {
      found = std::memcmp(&reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, wanted,
                          sizeof(in_addr)) == 0;
    } else if (!v4 && i->ifa_addr->sa_family == AF_INET6) {
      found = std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr, wanted,
                          sizeof(in6_addr)) == 0;
    }
  }
  freeifaddrs(interfaces);
  return found;
}

std::string JoinHostPort(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return v6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

absl::StatusOr<std::string> AdvertisedAddress(const std::string& advertise,
                                              const std::string& listen_host, int bound_port,
                                              const std::string& hostname) {
  if (!advertise.empty()) {
    // A bare host (no colon, or an IPv6 one in brackets) takes the bound port.
    const bool bare = advertise.find(':') == std::string::npos ||
                      (advertise.front() == '[' && advertise.back() == ']');
    ASSIGN_OR_RETURN(HostPort parsed, ParseHostPort(bare ? advertise + ":0" : advertise));
    if (IsWildcardHost(parsed.host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--advertise=", advertise, " names no host others can reach (give HOST or HOST:PORT)"));
    }
    return JoinHostPort(parsed.host, parsed.port == 0 ? bound_port : parsed.port);
  }
  if (!IsWildcardHost(listen_host)) return JoinHostPort(listen_host, bound_port);
  if (hostname.empty()) {
    return absl::InvalidArgumentError(
        "listening on every interface, but this machine has no name to advertise: give "
        "--advertise=HOST");
  }
  return JoinHostPort(hostname, bound_port);
}

}  // namespace downpour
