#include "common/metrics_http.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/net_address.h"
#include "common/tls_metrics_listener.h"

namespace downpour {
namespace {

// Opens and closes a connection to wake civetweb's accept loop, which
// otherwise notices a stop request only at its next 2 s poll timeout.
void Poke(const HostPort& address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(address.port);
  const std::string host = address.host == "0.0.0.0" ? "127.0.0.1" : address.host;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1) {
    (void)connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  close(fd);
}

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
    const MetricsHttpOptions& options, MetricsRegistry* registry) {
  auto parsed = ParseHostPort(options.listen);
  if (!parsed.ok()) return parsed.status();
  const bool has_cert = !options.tls_cert_file.empty();
  const bool has_key = !options.tls_key_file.empty();
  if (has_cert != has_key) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics over TLS needs both a certificate and a private key file; only the ",
                     has_cert ? "certificate (" : "key (",
                     has_cert ? options.tls_cert_file : options.tls_key_file, ") was given"));
  }
  if (has_cert) {
    auto listener = TlsMetricsListener::Start(parsed->host, parsed->port, options.tls_cert_file,
                                              options.tls_key_file,
                                              [registry] { return registry->Exposition(); });
    if (!listener.ok()) return listener.status();
    const int port = (*listener)->port();
    return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(
        nullptr, std::move(*listener), absl::StrCat(parsed->host, ":", port)));
  }
  static std::once_flag init_once;
  std::call_once(init_once, [] { mg_init_library(0); });
  const std::string ports = absl::StrCat(parsed->host, ":", parsed->port);
  const char* civetweb_options[] = {"listening_ports", ports.c_str(), "num_threads", "2", nullptr};
  mg_callbacks callbacks{};
  mg_init_data init{&callbacks, nullptr, civetweb_options};
  unsigned code = 0;
  char text[256] = {};
  mg_error_data error{&code, text, sizeof(text)};
  mg_context* context = mg_start2(&init, &error);
  if (context == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", options.listen, ": ",
                                               text[0] ? text : "address in use or invalid"));
  }
  mg_set_request_handler(context, "/metrics", HandleMetrics, registry);
  mg_server_port bound[4] = {};
  const int n = mg_get_server_ports(context, 4, bound);
  const int port = n > 0 ? bound[0].port : parsed->port;
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(context, nullptr, absl::StrCat(parsed->host, ":", port)));
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

std::string MetricsHttpServer::url() const {
  return absl::StrCat(tls() ? "https://" : "http://", address_, "/metrics");
}

MetricsHttpServer::MetricsHttpServer(mg_context* context,
                                     std::unique_ptr<TlsMetricsListener> tls_listener,
                                     std::string address)
    : context_(context), tls_listener_(std::move(tls_listener)), address_(std::move(address)) {}

MetricsHttpServer::~MetricsHttpServer() {
  if (context_ == nullptr) return;  // TLS: tls_listener_ stops itself
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    mg_stop(context_);
    stopped.store(true);
  });
  auto address = ParseHostPort(address_);
  while (!stopped.load() && address.ok()) {
    Poke(*address);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stopper.join();
}

}  // namespace downpour
