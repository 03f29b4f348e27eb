#include "common/metrics_http.h"

#include <civetweb.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/net_address.h"

namespace downpour {
namespace {

int HandleMetrics(mg_connection* connection, void* data) {
  const std::string body = static_cast<MetricsRegistry*>(data)->Exposition();
  mg_printf(connection,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            "Content-Length: %zu\r\nConnection: close\r\n\r\n",
            body.size());
  mg_write(connection, body.data(), body.size());
  return 200;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host_port, MetricsRegistry* registry) {
  auto parsed = ParseHostPort(host_port);
  if (!parsed.ok()) return parsed.status();
  static std::once_flag init_once;
  std::call_once(init_once, [] { mg_init_library(0); });
  const std::string ports = absl::StrCat(parsed->host, ":", parsed->port);
  const char* options[] = {"listening_ports", ports.c_str(), "num_threads", "2", nullptr};
  mg_callbacks callbacks{};
  mg_context* context = mg_start(&callbacks, nullptr, options);
  if (context == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", host_port, " (address in use or invalid)"));
  }
  mg_set_request_handler(context, "/metrics", HandleMetrics, registry);
  mg_server_port bound[4] = {};
  const int n = mg_get_server_ports(context, 4, bound);
  const int port = n > 0 ? bound[0].port : parsed->port;
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(context, absl::StrCat(parsed->host, ":", port)));
}

MetricsHttpServer::MetricsHttpServer(mg_context* context, std::string address)
    : context_(context), address_(std::move(address)) {}

MetricsHttpServer::~MetricsHttpServer() { mg_stop(context_); }

}  // namespace downpour
