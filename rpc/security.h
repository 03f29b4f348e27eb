// Transport security of every gRPC connection Downpour serves or makes: TLS
// from PEM files (--tls_cert, --tls_key, --tls_ca), mutual between daemons
// (a node presents its certificate to the coordinator and to shards), the
// files watched and reloaded when they change so certificates rotate
// without a restart; and the rule that keeps plaintext on loopback unless
// the operator says --insecure.
#ifndef DOWNPOUR_RPC_SECURITY_H_
#define DOWNPOUR_RPC_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace downpour {

// PEM files. All empty: plaintext.
struct TlsFiles {
  std::string cert;  // This process's certificate (chain).
  std::string key;   // Its private key.
  std::string ca;    // The CA bundle peers' certificates must chain to.

  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// What a daemon's security flags say (rpc/security_flags.h).
struct SecurityOptions {
  TlsFiles tls;
  // Plaintext on a non-loopback address is allowed.
  bool insecure = false;
  // How often the PEM files are checked for changes.
  absl::Duration reload_interval = absl::Seconds(60);
  // /metrics over HTTPS with tls.cert and tls.key (read at start).
  bool metrics_tls = false;
};

// Checks that the files of a server (or a client with a certificate: all
// three) can be read and belong together: the certificate and key are PEM
// and match, and the certificate chains to the CA. A client may give the CA
// alone (server authentication only, e.g. downpourctl with a token). One
// sentence naming the flag and file on failure.
absl::Status ValidateTlsFiles(const TlsFiles& files, bool client);

// Whether a server asks clients for certificates: shards and workers serve
// nodes only (required); the coordinator also serves operators, who may
// prove who they are with a token instead (optional, verified when given).
enum class ClientCertificates { kOptional, kRequired };

// Plaintext credentials when `options.tls` is empty; else TLS from the
// files, reloaded every `options.reload_interval` when they change.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityOptions& options, ClientCertificates client_certificates);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const SecurityOptions& options);

// Secure by default: listening on `listen` (HOST:PORT) without TLS is
// refused unless the host is loopback or `insecure` is set.
absl::Status CheckListenSecurity(const std::string& listen, const SecurityOptions& options);

// How a client proves who it is to the coordinator: its channel's
// credentials (a client certificate, or none) and, optionally, a bearer
// token sent with every call ("authorization: Bearer TOKEN").
struct ClientCredentials {
  std::shared_ptr<grpc::ChannelCredentials> channel;  // Null: plaintext.
  std::string bearer_token;
};

// The metadata key that carries a bearer token.
inline constexpr char kAuthorizationHeader[] = "authorization";

}  // namespace downpour

#endif  // DOWNPOUR_RPC_SECURITY_H_
