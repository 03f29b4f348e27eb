// Serves a MetricsRegistry at http://HOST:PORT/metrics (Prometheus text
// format) with civetweb. Thread-safe; the registry is not owned and must
// outlive the server.
#ifndef DOWNPOUR_COMMON_METRICS_HTTP_H_
#define DOWNPOUR_COMMON_METRICS_HTTP_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"

struct mg_context;

namespace downpour {

class MetricsHttpServer {
 public:
  // Listens on `host_port` ("127.0.0.1:0" picks a free port).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host_port,
                                                                  MetricsRegistry* registry);
  // Start, or nullptr when `host_port` is empty (metrics off).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> StartIfRequested(
      const std::string& host_port, MetricsRegistry* registry);
  ~MetricsHttpServer();

  // The bound address, HOST:PORT.
  const std::string& address() const { return address_; }

 private:
  MetricsHttpServer(mg_context* context, std::string address);

  mg_context* context_;
  std::string address_;
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_METRICS_HTTP_H_
