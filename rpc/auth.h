// Who calls a daemon, and whether they may. A caller is identified by its
// client certificate (verified by TLS against the cluster's CA) or by a
// bearer token:
//   - a certificate whose URI subject alternative name is
//     spiffe://downpour/node/ID makes its holder node ID (role NODE);
//   - an operator is a Principal of the coordinator's --auth_config, named
//     by a certificate URI or a token (compared by SHA-256, in constant time;
//     tokens are never logged).
// Without --auth_config the coordinator is open (loopback or --insecure
// clusters): everyone may call everything, but a caller holding a node
// certificate is still only that node.
#ifndef DOWNPOUR_RPC_AUTH_H_
#define DOWNPOUR_RPC_AUTH_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "proto/auth.pb.h"

namespace downpour {

// The URI a node certificate carries for node `id`.
std::string NodeCertificateUri(absl::string_view id);

// The node a peer's verified certificate names (its spiffe://downpour/node/
// URI), or "" when it presents none.
std::string PeerNodeId(const grpc::ServerContextBase& context);

// "admin", "viewer", "node".
std::string RoleName(CallerRole role);

struct Caller {
  // The principal's name or the node's id; "anonymous" on an open
  // coordinator without a certificate.
  std::string name;
  CallerRole role = CALLER_ROLE_UNSPECIFIED;
  bool is_node() const { return role == NODE; }
};

class Authenticator {
 public:
  // An open coordinator (no --auth_config).
  Authenticator() = default;
  // Reads --auth_config (text format), checking it: one sentence naming the
  // file and what is wrong.
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromFile(const std::string& path);
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromConfig(const AuthConfig& config);

  bool open() const { return !config_.has_value(); }

  // The caller of `context` may call `method` if its role is among
  // `allowed`; fills `caller` when it may. UNAUTHENTICATED when it proves no
  // identity, PERMISSION_DENIED when its role is not allowed, each with one
  // sentence. An open coordinator allows every call.
  grpc::Status Authorize(const grpc::ServerContextBase& context, absl::string_view method,
                         const std::vector<CallerRole>& allowed, Caller* caller) const;

  // SHA-256 of `token`, lower-case hex (what --auth_config holds).
  static std::string HashToken(absl::string_view token);

 private:
  explicit Authenticator(AuthConfig config) : config_(std::move(config)) {}
  // Who the caller is, or an UNAUTHENTICATED status.
  grpc::Status Identify(const grpc::ServerContextBase& context, Caller* caller) const;

  std::optional<AuthConfig> config_;
};

}  // namespace downpour

#endif  // DOWNPOUR_RPC_AUTH_H_
