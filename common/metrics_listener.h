// The socket side of MetricsHttpServer: answers GET /metrics over plain HTTP
// or, given a certificate and key, over HTTPS only (TLS 1.2 or later, with
// OpenSSL; a plain request fails the handshake and is closed).
//
// One thread polls the listening socket, a wake eventfd and every open
// connection, all non-blocking, so that no client can hold up another (issue
// 23: civetweb's two threads, each held for 30 s by a client that sent
// nothing, starved every scrape). A connection has `deadline` from its accept
// to finish the TLS handshake and send its request head, and as long again,
// from when its answer is ready, to take it; then it is closed. With
// `max_connections` open, a new one is accepted by closing the oldest
// connection that is not being answered. Every answer is HTTP/1.1 with
// Connection: close.
//
// Why not civetweb's TLS either: Debian 12's civetweb 1.15 looks up
// SSL_get_peer_certificate in libssl.so at run time, which OpenSSL 3 no
// longer exports (it is a macro there), and calls the missing function on
// every HTTPS connection: the process crashes (civetweb issue #1334).
//
// Thread-safe. The loop thread calls `body` once per GET /metrics and sends
// nothing meanwhile, so `body` must be quick (a registry's exposition is).
// Destruction stops the loop, closes every open connection and joins the
// thread.
#ifndef DOWNPOUR_COMMON_METRICS_LISTENER_H_
#define DOWNPOUR_COMMON_METRICS_LISTENER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace downpour {

struct MetricsListenerOptions {
  std::string host;  // a name or a numeric address; 0.0.0.0 or :: for every interface
  int port = 0;      // 0 picks a free one
  // PEM files: the certificate (then any intermediates, which are sent
  // along) and its unencrypted private key. Both set: HTTPS only; both
  // empty: plain HTTP. Read once, at Start.
  std::string tls_cert_file;
  std::string tls_key_file;
  // How long a connection may take to send its request head, and again to
  // take its answer. Prometheus sends its request at once and reads the
  // answer as it comes: well inside this on any network it can scrape over.
  absl::Duration deadline = absl::Seconds(2);
  // Open connections at most: each holds a descriptor and, with TLS,
  // OpenSSL's state. Never more than a quarter of the process's descriptor
  // limit (RLIMIT_NOFILE), which its other work needs.
  int max_connections = 1024;
};

class MetricsListener {
 public:
  // Listens and starts the loop thread; `body` makes each 200 answer's body.
  // InvalidArgument for a host that does not resolve, only one of the TLS
  // files, a file that holds no PEM certificate or no unencrypted private
  // key, or a key that does not match the certificate; the read error
  // (NotFound, PermissionDenied) of a file that cannot be read; Unavailable
  // when it cannot listen (address in use). Each message names the file or
  // the address.
  static absl::StatusOr<std::unique_ptr<MetricsListener>> Start(
      const MetricsListenerOptions& options, std::function<std::string()> body);
  ~MetricsListener();
  MetricsListener(const MetricsListener&) = delete;
  MetricsListener& operator=(const MetricsListener&) = delete;

  // The bound port.
  int port() const { return port_; }
  // Whether it speaks HTTPS.
  bool tls() const { return ctx_ != nullptr; }

 private:
  MetricsListener(SSL_CTX* ctx, int listen_fd, int wake_fd, int port,
                  const MetricsListenerOptions& options, std::function<std::string()> body);
  void Loop();

  SSL_CTX* const ctx_;  // owned; null for plain HTTP
  const int listen_fd_;
  const int wake_fd_;  // an eventfd: written once to stop the loop
  const int port_;
  const absl::Duration deadline_;
  const size_t max_connections_;
  const std::function<std::string()> body_;
  std::thread loop_;
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_METRICS_LISTENER_H_
