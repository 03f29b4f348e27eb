#include "rpc/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "google/protobuf/text_format.h"
#include "grpc/grpc_security_constants.h"
#include "rpc/security.h"

namespace downpour {
namespace {

constexpr absl::string_view kNodeUriPrefix = "spiffe://downpour/node/";
constexpr size_t kMaxNameBytes = 128;

// The peer's verified certificate URIs (none without TLS or a certificate).
std::vector<std::string> PeerUris(const grpc::ServerContextBase& context) {
  std::vector<std::string> uris;
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return uris;
  for (const grpc::string_ref& uri : auth->FindPropertyValues(GRPC_PEER_URI_PROPERTY_NAME)) {
    uris.emplace_back(uri.data(), uri.size());
  }
  return uris;
}

// The token of an "authorization: Bearer TOKEN" header, or "".
std::string BearerToken(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorizationHeader);
  if (it == metadata.end()) return "";
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, "Bearer ")) return "";
  return std::string(absl::StripAsciiWhitespace(value));
}

absl::Status CheckConfig(const AuthConfig& config) {
  std::set<std::string> names, tokens, uris;
  for (const Principal& principal : config.principal()) {
    const std::string& name = principal.name();
    if (name.empty() || name.size() > kMaxNameBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("a principal has no name, or one over ", kMaxNameBytes, " bytes"));
    }
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("principal ", name, " is named twice"));
    }
    if (principal.role() != ADMIN && principal.role() != VIEWER) {
      return absl::InvalidArgumentError(
          absl::StrCat("principal ", name,
                       " needs role ADMIN or VIEWER (NODE comes from node "
                       "certificates only)"));
    }
    if (principal.token_sha256().empty() && principal.certificate_uri().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("principal ", name, " has neither a token_sha256 nor a certificate_uri"));
    }
    for (const std::string& hash : principal.token_sha256()) {
      if (hash.size() != 64 || hash.find_first_not_of("0123456789abcdef") != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("principal ", name,
                         ": token_sha256 must be 64 lower-case hex digits (the SHA-256 of "
                         "the token, not the token)"));
      }
      if (!tokens.insert(hash).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("principal ", name, ": a token_sha256 is given twice"));
      }
    }
    for (const std::string& uri : principal.certificate_uri()) {
      if (absl::StartsWith(uri, kNodeUriPrefix)) {
        return absl::InvalidArgumentError(absl::StrCat("principal ", name, ": ", uri,
                                                       " is a node's identity, not an operator's"));
      }
      if (uri.empty() || !uris.insert(uri).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("principal ", name, ": a certificate_uri is empty or given twice"));
      }
    }
  }
  return absl::OkStatus();
}

grpc::Status Unauthenticated(std::string why) {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::move(why));
}

}  // namespace

std::string NodeCertificateUri(absl::string_view id) { return absl::StrCat(kNodeUriPrefix, id); }

std::string PeerNodeId(const grpc::ServerContextBase& context) {
  for (const std::string& uri : PeerUris(context)) {
    absl::string_view id = uri;
    if (absl::ConsumePrefix(&id, kNodeUriPrefix) && !id.empty()) return std::string(id);
  }
  return "";
}

std::string RoleName(CallerRole role) {
  switch (role) {
    case ADMIN:
      return "admin";
    case VIEWER:
      return "viewer";
    case NODE:
      return "node";
    default:
      return "none";
  }
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("--auth_config=", path, " cannot be read"));
  }
  std::stringstream text;
  text << in.rdbuf();
  AuthConfig config;
  if (!google::protobuf::TextFormat::ParseFromString(text.str(), &config)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--auth_config=", path, " is not a text-format downpour.AuthConfig (proto/auth.proto)"));
  }
  absl::StatusOr<std::unique_ptr<Authenticator>> authenticator = FromConfig(config);
  if (!authenticator.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_config=", path, ": ", authenticator.status().message()));
  }
  return authenticator;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromConfig(const AuthConfig& config) {
  if (absl::Status status = CheckConfig(config); !status.ok()) return status;
  return std::unique_ptr<Authenticator>(new Authenticator(config));
}

std::string Authenticator::HashToken(absl::string_view token) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(token.data(), token.size(), digest, &size, EVP_sha256(), nullptr);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), size));
}

grpc::Status Authenticator::Identify(const grpc::ServerContextBase& context, Caller* caller) const {
  const std::vector<std::string> uris = PeerUris(context);
  if (const std::string node = PeerNodeId(context); !node.empty()) {
    *caller = Caller{node, NODE};
    return grpc::Status::OK;
  }
  if (open()) {
    *caller = Caller{"anonymous", ADMIN};
    return grpc::Status::OK;
  }
  for (const Principal& principal : config_->principal()) {
    for (const std::string& uri : principal.certificate_uri()) {
      if (std::find(uris.begin(), uris.end(), uri) != uris.end()) {
        *caller = Caller{principal.name(), principal.role()};
        return grpc::Status::OK;
      }
    }
  }
  const std::string token = BearerToken(context);
  if (token.empty()) {
    return Unauthenticated(
        uris.empty() ? "no credentials: give a token (--token_file or DOWNPOUR_TOKEN) or a client "
                       "certificate (--tls_cert, --tls_key) the coordinator's --auth_config names"
                     : absl::StrCat("the client certificate (", absl::StrJoin(uris, ", "),
                                    ") names no principal of the coordinator's --auth_config"));
  }
  // Every stored hash is compared, in constant time, whatever matches.
  const std::string hash = HashToken(token);
  const Principal* match = nullptr;
  for (const Principal& principal : config_->principal()) {
    for (const std::string& stored : principal.token_sha256()) {
      if (stored.size() == hash.size() &&
          CRYPTO_memcmp(stored.data(), hash.data(), hash.size()) == 0) {
        match = &principal;
      }
    }
  }
  if (match == nullptr) {
    return Unauthenticated("the token matches no principal of the coordinator's --auth_config");
  }
  *caller = Caller{match->name(), match->role()};
  return grpc::Status::OK;
}

grpc::Status Authenticator::Authorize(const grpc::ServerContextBase& context,
                                      absl::string_view method,
                                      const std::vector<CallerRole>& allowed,
                                      Caller* caller) const {
  grpc::Status status = Identify(context, caller);
  if (!status.ok() || open()) return status;
  if (std::find(allowed.begin(), allowed.end(), caller->role) != allowed.end()) {
    return grpc::Status::OK;
  }
  std::vector<std::string> needs;
  for (CallerRole role : allowed) needs.push_back(RoleName(role));
  return grpc::Status(
      grpc::StatusCode::PERMISSION_DENIED,
      absl::StrCat(caller->name, " (role ", RoleName(caller->role), ") may not call ", method,
                   needs.empty() ? ": no role may"
                                 : absl::StrCat(": it needs role ", absl::StrJoin(needs, " or "))));
}

}  // namespace downpour
