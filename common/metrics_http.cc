#include "common/metrics_http.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metrics_listener.h"
#include "common/net_address.h"

namespace downpour {

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const MetricsHttpOptions& options, MetricsRegistry* registry) {
  auto parsed = ParseHostPort(options.listen);
  if (!parsed.ok()) return parsed.status();
  MetricsListenerOptions listen;
  listen.host = parsed->host;
  listen.port = parsed->port;
  listen.tls_cert_file = options.tls_cert_file;
  listen.tls_key_file = options.tls_key_file;
  auto listener = MetricsListener::Start(listen, [registry] { return registry->Exposition(); });
  if (!listener.ok()) return listener.status();
  std::string address = JoinHostPort(parsed->host, (*listener)->port());
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(std::move(*listener), std::move(address)));
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::StartIfRequested(
    const MetricsHttpOptions& options, MetricsRegistry* registry) {
  if (options.listen.empty()) return std::unique_ptr<MetricsHttpServer>();
  return Start(options, registry);
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host_port, MetricsRegistry* registry) {
  MetricsHttpOptions options;
  options.listen = host_port;
  return Start(options, registry);
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::StartIfRequested(
    const std::string& host_port, MetricsRegistry* registry) {
  if (host_port.empty()) return std::unique_ptr<MetricsHttpServer>();
  return Start(host_port, registry);
}

bool MetricsHttpServer::tls() const { return listener_->tls(); }

std::string MetricsHttpServer::url() const {
  return absl::StrCat(tls() ? "https://" : "http://", address_, "/metrics");
}

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<MetricsListener> listener, std::string address)
    : listener_(std::move(listener)), address_(std::move(address)) {}

MetricsHttpServer::~MetricsHttpServer() = default;

}  // namespace downpour
