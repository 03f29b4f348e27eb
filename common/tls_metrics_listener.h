// The HTTPS side of MetricsHttpServer: answers GET /metrics over TLS 1.2 or
// later with OpenSSL, and nothing in plain HTTP (a plain request fails the
// handshake and the connection is closed).
//
// Why not civetweb's own TLS: Debian 12's civetweb 1.15 looks up
// SSL_get_peer_certificate in libssl.so at run time, which OpenSSL 3 no
// longer exports (it is a macro there), and calls the missing function on
// every HTTPS connection: the process crashes (civetweb issue #1334). The
// daemons link OpenSSL 3 anyway (through gRPC).
//
// Thread-safe. An acceptor thread hands connections to two worker threads;
// a connection that sends nothing for 10 s is dropped. Destruction stops
// accepting, cuts open connections and joins the threads.
#ifndef DOWNPOUR_COMMON_TLS_METRICS_LISTENER_H_
#define DOWNPOUR_COMMON_TLS_METRICS_LISTENER_H_

#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace downpour {

class TlsMetricsListener {
 public:
  // Listens on host:port (port 0 picks one) with the PEM certificate (then
  // any intermediates, sent along) and unencrypted private key in the two
  // files; `body` makes each response's body (called on a worker thread).
  // Errors name the file or address and say what is wrong with it.
  static absl::StatusOr<std::unique_ptr<TlsMetricsListener>> Start(
      const std::string& host, int port, const std::string& cert_file, const std::string& key_file,
      std::function<std::string()> body);
  ~TlsMetricsListener();
  TlsMetricsListener(const TlsMetricsListener&) = delete;
  TlsMetricsListener& operator=(const TlsMetricsListener&) = delete;

  // The bound port.
  int port() const { return port_; }

 private:
  TlsMetricsListener(SSL_CTX* ctx, int listen_fd, int wake_fd, int port,
                     std::function<std::string()> body);
  void Accept();
  void Work();
  void Serve(int fd);

  SSL_CTX* const ctx_;
  const int listen_fd_;
  const int wake_fd_;  // an eventfd: written once to stop the acceptor
  const int port_;
  const std::function<std::string()> body_;

  absl::Mutex mu_;
  absl::CondVar queued_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<int> pending_ ABSL_GUARDED_BY(mu_);  // accepted, not yet served
  std::set<int> serving_ ABSL_GUARDED_BY(mu_);    // cut on stop
  std::vector<std::thread> threads_;
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_TLS_METRICS_LISTENER_H_
