// Serves a MetricsRegistry at /metrics (Prometheus text format): plain HTTP,
// or, given a certificate and key, HTTPS only, on one thread that no idle or
// slow client can hold up (common/metrics_listener.h). Thread-safe; the
// registry is not owned and must outlive the server.
#ifndef DOWNPOUR_COMMON_METRICS_HTTP_H_
#define DOWNPOUR_COMMON_METRICS_HTTP_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace downpour {

class MetricsListener;

struct MetricsHttpOptions {
  // HOST:PORT to listen on ("127.0.0.1:0" picks a free port). Empty:
  // StartIfRequested serves nothing.
  std::string listen;
  // PEM files: the server's certificate (then any intermediates, which are
  // sent along) and its unencrypted private key. Both set: the port speaks
  // HTTPS only (TLS 1.2 or later) and a plain HTTP request gets no answer;
  // both empty: plain HTTP. Both are read once, at Start.
  std::string tls_cert_file;
  std::string tls_key_file;
};

class MetricsHttpServer {
 public:
  // InvalidArgument for a bad address, only one of the TLS files, a file
  // that holds no PEM certificate or no unencrypted private key, or a key
  // that does not match the certificate; the read error (NotFound,
  // PermissionDenied) of a file that cannot be read; Unavailable when it
  // cannot listen (address in use). Each message names the file or address.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const MetricsHttpOptions& options,
                                                                  MetricsRegistry* registry);
  // Start, or nullptr when `options.listen` is empty (metrics off).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> StartIfRequested(
      const MetricsHttpOptions& options, MetricsRegistry* registry);
  // Plain HTTP on `host_port`.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host_port,
                                                                  MetricsRegistry* registry);
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> StartIfRequested(
      const std::string& host_port, MetricsRegistry* registry);
  ~MetricsHttpServer();

  // The bound address, HOST:PORT.
  const std::string& address() const { return address_; }
  // Whether it serves HTTPS.
  bool tls() const;
  // "http://HOST:PORT/metrics", or https://.
  std::string url() const;

 private:
  MetricsHttpServer(std::unique_ptr<MetricsListener> listener, std::string address);

  std::unique_ptr<MetricsListener> listener_;
  std::string address_;
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_METRICS_HTTP_H_
