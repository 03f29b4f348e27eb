#include "common/net_address.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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

}  // namespace downpour
