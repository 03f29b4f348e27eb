#include "common/net_address.h"

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
