// downpourctl's config file: named contexts, each a coordinator address,
// and the current one (kubectl's kubeconfig habit). The file is a small
// YAML subset, written by `downpourctl config set-context` and editable by
// hand:
//
//   current-context: prod
//   contexts:
//   - name: prod
//     coordinator: coordinator.example.org:7070
//     tls_ca: /etc/downpour/ca.crt
//     token_file: /home/me/.config/downpour/prod.token
//   - name: local
//     coordinator: 127.0.0.1:7070
//
// Where the coordinator comes from, first match wins: --coordinator,
// --context's address, the DOWNPOUR_COORDINATOR environment variable, the
// current context's address, 127.0.0.1:7070. Thread-compatible.
#ifndef DOWNPOUR_CLIENT_CONFIG_H_
#define DOWNPOUR_CLIENT_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace downpour {

struct CtlContext {
  std::string name;
  std::string coordinator;
  // How to prove who we are to a coordinator that serves TLS (--tls_ca,
  // --tls_cert, --tls_key, --token_file); empty: not given.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string token_file;
};

struct CtlConfig {
  std::string current_context;
  std::vector<CtlContext> contexts;

  // Null when there is no context of that name.
  const CtlContext* Find(const std::string& name) const;
};

// $XDG_CONFIG_HOME/downpour/config.yaml, else $HOME/.config/downpour/
// config.yaml ("" when neither variable is set).
std::string DefaultConfigPath(const char* xdg_config_home, const char* home);

// A missing file is an empty config; a malformed one is InvalidArgument
// naming the file and line.
absl::StatusOr<CtlConfig> LoadCtlConfig(const std::string& path);
absl::StatusOr<CtlConfig> ParseCtlConfig(const std::string& text, const std::string& path);
std::string FormatCtlConfig(const CtlConfig& config);
// Writes atomically, creating the directory.
absl::Status SaveCtlConfig(const std::string& path, const CtlConfig& config);

// The TLS files and token file to use: each of `flags`' when given, else
// that of the context the coordinator came from (`source`, as
// ResolveCoordinator set it: "context NAME").
CtlContext ResolveSecurity(const CtlContext& flags, const std::string& source,
                           const CtlConfig& config);

// The coordinator to talk to (see the header comment); `source` says where
// it came from, for messages. InvalidArgument for an unknown --context or a
// current-context that names no context.
absl::StatusOr<std::string> ResolveCoordinator(const std::string& flag, const char* env,
                                               const std::string& context_flag,
                                               const CtlConfig& config, std::string* source);

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_CONFIG_H_
