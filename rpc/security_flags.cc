#include "rpc/security_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate this daemon presents, as a server and to the daemons it calls "
          "(scripts/make-certs.sh); with --tls_key and --tls_ca, every gRPC connection is TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle: peers' certificates must chain to it (mutual TLS between daemons)");
ABSL_FLAG(int32_t, tls_reload_s, 60,
          "How often the TLS files are checked; changed ones are loaded for new connections "
          "without a restart");
ABSL_FLAG(bool, metrics_tls, false,
          "Serve /metrics (--metrics_listen) over HTTPS with --tls_cert and --tls_key");
ABSL_FLAG(bool, insecure, false,
          "Serve plaintext gRPC on an address other machines can reach (refused without this; "
          "loopback is always allowed)");

namespace downpour {

SecurityOptions SecurityOptionsFromFlags() {
  SecurityOptions options;
  options.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key = absl::GetFlag(FLAGS_tls_key);
  options.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  options.reload_interval = absl::Seconds(absl::GetFlag(FLAGS_tls_reload_s));
  options.insecure = absl::GetFlag(FLAGS_insecure);
  options.metrics_tls = absl::GetFlag(FLAGS_metrics_tls);
  return options;
}

}  // namespace downpour
