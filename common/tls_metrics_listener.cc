#include "common/tls_metrics_listener.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file.h"

namespace downpour {
namespace {

constexpr int kWorkers = 2;
// Accepted connections waiting for a worker; more are closed at once.
constexpr size_t kMaxPending = 32;
// A client silent (or not reading) this long is dropped.
constexpr int kIdleSeconds = 10;
constexpr size_t kMaxRequestHead = size_t{16} << 10;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
struct SslFree {
  void operator()(SSL* s) const { SSL_free(s); }
};

// This thread's queued OpenSSL errors as one line; empties the queue.
std::string OpensslErrors() {
  std::string text;
  while (const auto e = ERR_get_error()) {
    char line[256];
    ERR_error_string_n(e, line, sizeof(line));
    absl::StrAppend(&text, text.empty() ? "" : "; ", line);
  }
  return text.empty() ? "no OpenSSL error recorded" : text;
}

// OpenSSL's default would ask for a passphrase on the terminal.
int NoPassphrase(char*, int, int, void*) { return -1; }

std::unique_ptr<BIO, BioFree> MemoryBio(const std::string& text) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// A server context with the certificate chain and key of the two PEM files,
// each read once.
absl::StatusOr<std::unique_ptr<SSL_CTX, CtxFree>> MakeContext(const std::string& cert_file,
                                                              const std::string& key_file) {
  auto cert = ReadFileToString(cert_file);
  if (!cert.ok()) {
    return absl::Status(cert.status().code(), absl::StrCat("cannot read the metrics TLS "
                                                           "certificate: ",
                                                           cert.status().message()));
  }
  auto key = ReadFileToString(key_file);
  if (!key.ok()) {
    return absl::Status(key.status().code(),
                        absl::StrCat("cannot read the metrics TLS key: ", key.status().message()));
  }
  if (absl::StrContains(*key, "ENCRYPTED")) {
    return absl::InvalidArgumentError(absl::StrCat("the metrics TLS key ", key_file,
                                                   " is encrypted; give an unencrypted key file"));
  }
  ERR_clear_error();
  std::unique_ptr<SSL_CTX, CtxFree> ctx(SSL_CTX_new(TLS_server_method()));
  if (ctx == nullptr || SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION) != 1) {
    return absl::InternalError(
        absl::StrCat("cannot set up OpenSSL for metrics over TLS: ", OpensslErrors()));
  }
  SSL_CTX_set_default_passwd_cb(ctx.get(), NoPassphrase);

  auto cert_bio = MemoryBio(*cert);
  std::unique_ptr<X509, X509Free> leaf(
      PEM_read_bio_X509_AUX(cert_bio.get(), nullptr, NoPassphrase, nullptr));
  if (leaf == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("the metrics TLS certificate ", cert_file,
                                                   " holds no PEM certificate (", OpensslErrors(),
                                                   ")"));
  }
  if (SSL_CTX_use_certificate(ctx.get(), leaf.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot use the metrics TLS certificate ", cert_file, ": ", OpensslErrors()));
  }
  // The certificates after the first are the chain sent to clients.
  while (X509* intermediate = PEM_read_bio_X509(cert_bio.get(), nullptr, NoPassphrase, nullptr)) {
    if (SSL_CTX_add0_chain_cert(ctx.get(), intermediate) != 1) {
      X509_free(intermediate);
      return absl::InvalidArgumentError(
          absl::StrCat("cannot use the chain in the metrics TLS certificate ", cert_file, ": ",
                       OpensslErrors()));
    }
  }
  ERR_clear_error();  // reading ends with "no start line"

  auto key_bio = MemoryBio(*key);
  std::unique_ptr<EVP_PKEY, PkeyFree> pkey(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, NoPassphrase, nullptr));
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the metrics TLS key ", key_file, " holds no PEM private key (", OpensslErrors(), ")"));
  }
  if (SSL_CTX_use_PrivateKey(ctx.get(), pkey.get()) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("the metrics TLS key ", key_file,
                                                   " does not match the certificate ", cert_file,
                                                   " (", OpensslErrors(), ")"));
  }
  return ctx;
}

// A listening socket on host:port; `bound` gets the port.
absl::StatusOr<int> Listen(const std::string& host, int port, int* bound) {
  const std::string where = absl::StrCat(host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot serve metrics over TLS on ", where, ": ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, freeaddrinfo);
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open a socket for ", where));
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (bind(fd, found->ai_addr, found->ai_addrlen) != 0 || listen(fd, 64) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics over TLS on ", where, ": ", strerror(err)));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *bound = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return fd;
}

std::string Response(absl::string_view status, absl::string_view body) {
  return absl::StrCat("HTTP/1.1 ", status,
                      "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                      "Content-Length: ",
                      body.size(), "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsMetricsListener>> TlsMetricsListener::Start(
    const std::string& host, int port, const std::string& cert_file, const std::string& key_file,
    std::function<std::string()> body) {
  auto ctx = MakeContext(cert_file, key_file);
  if (!ctx.ok()) return ctx.status();
  int bound = 0;
  auto fd = Listen(host, port, &bound);
  if (!fd.ok()) return fd.status();
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    const int err = errno;
    close(*fd);
    return ErrnoStatus(err, "cannot create the metrics listener's eventfd");
  }
  std::unique_ptr<TlsMetricsListener> listener(
      new TlsMetricsListener(ctx->release(), *fd, wake, bound, std::move(body)));
  listener->threads_.emplace_back(&TlsMetricsListener::Accept, listener.get());
  for (int i = 0; i < kWorkers; ++i) {
    listener->threads_.emplace_back(&TlsMetricsListener::Work, listener.get());
  }
  return listener;
}

TlsMetricsListener::TlsMetricsListener(SSL_CTX* ctx, int listen_fd, int wake_fd, int port,
                                       std::function<std::string()> body)
    : ctx_(ctx), listen_fd_(listen_fd), wake_fd_(wake_fd), port_(port), body_(std::move(body)) {}

TlsMetricsListener::~TlsMetricsListener() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (const int fd : serving_) shutdown(fd, SHUT_RDWR);
    queued_.SignalAll();
  }
  const uint64_t one = 1;
  // Fails only if the counter would overflow, which one write cannot do.
  if (write(wake_fd_, &one, sizeof(one)) != sizeof(one)) shutdown(listen_fd_, SHUT_RDWR);
  for (std::thread& thread : threads_) thread.join();
  {
    absl::MutexLock lock(&mu_);
    for (const int fd : pending_) close(fd);
  }
  close(listen_fd_);
  close(wake_fd_);
  SSL_CTX_free(ctx_);
}

void TlsMetricsListener::Accept() {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  int wait_ms = -1;
  for (;;) {
    if (poll(fds, 2, wait_ms) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    wait_ms = -1;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors: the connection stays queued; look again in a
      // while rather than spin.
      if (errno == EMFILE || errno == ENFILE) wait_ms = 100;
      continue;
    }
    absl::MutexLock lock(&mu_);
    if (stopping_ || pending_.size() >= kMaxPending) {
      close(fd);
      continue;
    }
    pending_.push_back(fd);
    queued_.Signal();
  }
}

void TlsMetricsListener::Work() {
  // A client gone before its response is written must not kill the process.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  for (;;) {
    int fd = -1;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && pending_.empty()) queued_.Wait(&mu_);
      if (stopping_) return;
      fd = pending_.front();
      pending_.pop_front();
      serving_.insert(fd);
    }
    Serve(fd);
    {
      absl::MutexLock lock(&mu_);
      serving_.erase(fd);
    }
    close(fd);
  }
}

void TlsMetricsListener::Serve(int fd) {
  const timeval idle{kIdleSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &idle, sizeof(idle));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &idle, sizeof(idle));
  std::unique_ptr<SSL, SslFree> ssl(SSL_new(ctx_));
  // A plain HTTP request (or any non-TLS bytes) fails here.
  if (ssl == nullptr || SSL_set_fd(ssl.get(), fd) != 1 || SSL_accept(ssl.get()) != 1) {
    ERR_clear_error();
    return;
  }
  std::string head;
  char chunk[4096];
  while (head.find("\r\n\r\n") == std::string::npos && head.size() < kMaxRequestHead) {
    const int n = SSL_read(ssl.get(), chunk, sizeof(chunk));
    if (n <= 0) {
      ERR_clear_error();
      return;
    }
    head.append(chunk, static_cast<size_t>(n));
  }
  const std::vector<std::string> request = absl::StrSplit(head.substr(0, head.find("\r\n")), ' ');
  std::string response;
  if (head.find("\r\n\r\n") == std::string::npos) {
    response = Response("431 Request Header Fields Too Large", "request head too large\n");
  } else if (request.size() != 3 || !absl::StartsWith(request[2], "HTTP/1.")) {
    response = Response("400 Bad Request", "not an HTTP/1 request\n");
  } else if (request[0] != "GET") {
    response = Response("405 Method Not Allowed", "only GET\n");
  } else if (request[1].substr(0, request[1].find('?')) != "/metrics") {
    response = Response("404 Not Found", "only /metrics\n");
  } else {
    response = Response("200 OK", body_());
  }
  if (SSL_write(ssl.get(), response.data(), static_cast<int>(response.size())) > 0) {
    SSL_shutdown(ssl.get());
  }
  ERR_clear_error();
}

}  // namespace downpour
