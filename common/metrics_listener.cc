#include "common/metrics_listener.h"

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
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <list>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "common/net_address.h"

namespace downpour {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxRequestHead = size_t{16} << 10;
// Connections accepted per turn of the loop, so that a flood of new ones
// does not keep the open ones waiting.
constexpr int kAcceptsPerTurn = 64;
// Out of descriptors with nothing to close: how long the listening socket
// is left alone (its connections wait in the backlog) instead of spinning.
constexpr auto kOutOfDescriptorsPause = std::chrono::milliseconds(100);

// The most connections it keeps open: `wanted`, but at most a quarter of
// the descriptors the process may open, so that a flood of clients cannot
// take those its real work needs (gRPC, checkpoints).
size_t ConnectionLimit(int wanted) {
  size_t limit = static_cast<size_t>(std::max(wanted, 1));
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    limit = std::min<size_t>(limit, std::max<size_t>(files.rlim_cur / 4, 1));
  }
  return limit;
}

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
  // Non-blocking writes: SSL_write may take part of the answer, and a retry
  // passes the rest. Idle connections give their buffers back.
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                                  SSL_MODE_RELEASE_BUFFERS);

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

// A non-blocking listening socket on host:port; `bound` gets the port.
absl::StatusOr<int> Listen(const std::string& host, int port, int* bound) {
  const std::string where = JoinHostPort(host, port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot serve metrics on ", where, ": ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, freeaddrinfo);
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open a socket for ", where));
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (bind(fd, found->ai_addr, found->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", where, ": ", strerror(err)));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *bound = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return fd;
}

std::string Response(absl::string_view status, absl::string_view content_type,
                     absl::string_view body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

// The answer to a request head (complete, or kMaxRequestHead bytes of one).
std::string Answer(const std::string& head, const std::function<std::string()>& body) {
  constexpr absl::string_view kText = "text/plain; charset=utf-8";
  if (head.find("\r\n\r\n") == std::string::npos) {
    return Response("431 Request Header Fields Too Large", kText, "request head too large\n");
  }
  const std::vector<std::string> request = absl::StrSplit(head.substr(0, head.find("\r\n")), ' ');
  if (request.size() != 3 || !absl::StartsWith(request[2], "HTTP/1.")) {
    return Response("400 Bad Request", kText, "not an HTTP/1 request\n");
  }
  if (request[0] != "GET") return Response("405 Method Not Allowed", kText, "only GET\n");
  if (request[1].substr(0, request[1].find('?')) != "/metrics") {
    return Response("404 Not Found", kText, "only /metrics\n");
  }
  return Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", body());
}

// One client, from accept to close, driven by the loop whenever poll()
// finds its socket ready for what it waits for.
class Connection {
 public:
  // Takes `fd` (non-blocking) and `ssl` (null for plain HTTP).
  Connection(int fd, SSL* ssl, Clock::time_point deadline)
      : fd_(fd),
        ssl_(ssl),
        phase_(ssl ? Phase::kHandshake : Phase::kRequest),
        deadline_(deadline) {}
  ~Connection() {
    SSL_free(ssl_);
    close(fd_);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int fd() const { return fd_; }
  short events() const { return events_; }
  Clock::time_point deadline() const { return deadline_; }
  // Whether its answer is on the way: the last connection to close for a
  // new one.
  bool answering() const { return phase_ == Phase::kAnswer || phase_ == Phase::kTlsShutdown; }

  // Goes as far as the socket allows without blocking. False when the
  // connection is done with (answered, failed or gone): close it.
  bool Advance(const std::function<std::string()>& body, Clock::duration answer_time) {
    for (;;) {
      switch (phase_) {
        case Phase::kHandshake: {
          ERR_clear_error();
          const int rc = SSL_accept(ssl_);
          // A plain HTTP request (or any non-TLS bytes) fails here.
          if (rc != 1) return WaitForTls(rc);
          phase_ = Phase::kRequest;
          break;
        }
        case Phase::kRequest: {
          const ReadResult read = ReadHead();
          if (read == ReadResult::kFailed) return false;
          if (read == ReadResult::kWouldBlock) return true;
          answer_ = Answer(head_, body);
          head_.clear();
          deadline_ = Clock::now() + answer_time;
          phase_ = Phase::kAnswer;
          break;
        }
        case Phase::kAnswer: {
          while (sent_ < answer_.size()) {
            const size_t left = answer_.size() - sent_;
            if (ssl_ != nullptr) {
              ERR_clear_error();
              const int n = SSL_write(ssl_, answer_.data() + sent_,
                                      static_cast<int>(std::min<size_t>(left, INT32_MAX)));
              if (n <= 0) return WaitForTls(n);
              sent_ += static_cast<size_t>(n);
            } else {
              const ssize_t n = send(fd_, answer_.data() + sent_, left, MSG_NOSIGNAL);
              if (n < 0) return WaitForSocket(POLLOUT);
              sent_ += static_cast<size_t>(n);
            }
          }
          answer_.clear();
          answer_.shrink_to_fit();
          phase_ = ssl_ != nullptr ? Phase::kTlsShutdown : Phase::kDraining;
          if (ssl_ == nullptr) shutdown(fd_, SHUT_WR);
          break;
        }
        case Phase::kTlsShutdown: {
          ERR_clear_error();
          const int rc = SSL_shutdown(ssl_);  // 0: our close_notify is sent
          if (rc < 0) return WaitForTls(rc);
          shutdown(fd_, SHUT_WR);
          phase_ = Phase::kDraining;
          break;
        }
        case Phase::kDraining: {
          // Closing with unread bytes would reset the connection and could
          // destroy the answer before the client has read it; so read
          // whatever else it sends until it closes (or the deadline).
          char discard[4096];
          for (;;) {
            const ssize_t n = recv(fd_, discard, sizeof(discard), 0);
            if (n == 0) return false;
            if (n < 0) return WaitForSocket(POLLIN);
          }
        }
      }
    }
  }

 private:
  enum class Phase {
    kHandshake,    // TLS: SSL_accept
    kRequest,      // reading the request head
    kAnswer,       // writing answer_
    kTlsShutdown,  // TLS: sending close_notify
    kDraining,     // answered and shut for writing: waiting for the client to close
  };
  enum class ReadResult { kComplete, kWouldBlock, kFailed };

  // Reads until the head is complete (or too large) or no more bytes wait;
  // with TLS, until SSL_read wants more from the socket, so that nothing
  // is left in OpenSSL's buffer that poll() cannot see.
  ReadResult ReadHead() {
    char chunk[4096];
    for (;;) {
      int n = 0;
      if (ssl_ != nullptr) {
        ERR_clear_error();
        n = SSL_read(ssl_, chunk, sizeof(chunk));
        if (n <= 0) return WaitForTls(n) ? ReadResult::kWouldBlock : ReadResult::kFailed;
      } else {
        const ssize_t got = recv(fd_, chunk, sizeof(chunk), 0);
        if (got == 0) return ReadResult::kFailed;
        if (got < 0) return WaitForSocket(POLLIN) ? ReadResult::kWouldBlock : ReadResult::kFailed;
        n = static_cast<int>(got);
      }
      const size_t searched = head_.size() < 3 ? 0 : head_.size() - 3;
      head_.append(chunk, static_cast<size_t>(n));
      if (head_.find("\r\n\r\n", searched) != std::string::npos) return ReadResult::kComplete;
      if (head_.size() >= kMaxRequestHead) {
        head_.resize(kMaxRequestHead);
        return ReadResult::kComplete;
      }
    }
  }

  // After a socket call failed: true (waiting for `events`) when it would
  // have blocked or was interrupted, false for a real error.
  bool WaitForSocket(short events) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    events_ = events;
    return true;
  }

  // After an OpenSSL call returned `rc`: true when it waits for the socket
  // (events_ says for what), false when the connection failed or was
  // closed.
  bool WaitForTls(int rc) {
    switch (SSL_get_error(ssl_, rc)) {
      case SSL_ERROR_WANT_READ:
        events_ = POLLIN;
        return true;
      case SSL_ERROR_WANT_WRITE:
        events_ = POLLOUT;
        return true;
      default:
        ERR_clear_error();
        return false;
    }
  }

  const int fd_;
  SSL* const ssl_;
  Phase phase_;
  Clock::time_point deadline_;
  short events_ = POLLIN;
  std::string head_;
  std::string answer_;
  size_t sent_ = 0;
};

// Closes the oldest connection that is not being answered, or else the
// oldest. REQUIRES: `open` not empty, oldest first.
void CloseOldestIdle(std::list<Connection>* open) {
  auto victim =
      std::find_if(open->begin(), open->end(), [](const Connection& c) { return !c.answering(); });
  open->erase(victim != open->end() ? victim : open->begin());
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsListener>> MetricsListener::Start(
    const MetricsListenerOptions& options, std::function<std::string()> body) {
  const bool has_cert = !options.tls_cert_file.empty();
  const bool has_key = !options.tls_key_file.empty();
  if (has_cert != has_key) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics over TLS needs both a certificate and a private key file; only the ",
                     has_cert ? "certificate (" : "key (",
                     has_cert ? options.tls_cert_file : options.tls_key_file, ") was given"));
  }
  std::unique_ptr<SSL_CTX, CtxFree> ctx;
  if (has_cert) {
    auto made = MakeContext(options.tls_cert_file, options.tls_key_file);
    if (!made.ok()) return made.status();
    ctx = std::move(*made);
  }
  int bound = 0;
  auto fd = Listen(options.host, options.port, &bound);
  if (!fd.ok()) return fd.status();
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    const int err = errno;
    close(*fd);
    return ErrnoStatus(err, "cannot create the metrics listener's eventfd");
  }
  std::unique_ptr<MetricsListener> listener(
      new MetricsListener(ctx.release(), *fd, wake, bound, options, std::move(body)));
  listener->loop_ = std::thread(&MetricsListener::Loop, listener.get());
  return listener;
}

MetricsListener::MetricsListener(SSL_CTX* ctx, int listen_fd, int wake_fd, int port,
                                 const MetricsListenerOptions& options,
                                 std::function<std::string()> body)
    : ctx_(ctx),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      port_(port),
      deadline_(options.deadline),
      max_connections_(ConnectionLimit(options.max_connections)),
      body_(std::move(body)) {}

MetricsListener::~MetricsListener() {
  const uint64_t one = 1;
  // Fails only if the counter would overflow, which one write cannot do.
  if (write(wake_fd_, &one, sizeof(one)) != sizeof(one)) shutdown(listen_fd_, SHUT_RDWR);
  if (loop_.joinable()) loop_.join();
  close(listen_fd_);
  close(wake_fd_);
  SSL_CTX_free(ctx_);
}

void MetricsListener::Loop() {
  // A client gone before its answer is written must not kill the process:
  // SSL_write writes to the socket without MSG_NOSIGNAL.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);

  const Clock::duration deadline = absl::ToChronoNanoseconds(deadline_);
  std::list<Connection> open;  // oldest first; closed when the loop returns
  std::vector<pollfd> fds;
  std::vector<std::list<Connection>::iterator> polled;  // fds[i + 2]'s connection
  Clock::time_point accept_paused_until;
  for (;;) {
    const Clock::time_point now = Clock::now();
    Clock::time_point wake_at = Clock::time_point::max();
    for (auto it = open.begin(); it != open.end();) {
      if (it->deadline() <= now) {
        it = open.erase(it);
      } else {
        wake_at = std::min(wake_at, it->deadline());
        ++it;
      }
    }
    const bool accepting = now >= accept_paused_until;
    if (!accepting) wake_at = std::min(wake_at, accept_paused_until);
    fds.clear();
    polled.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});  // poll skips a negative fd
    for (auto it = open.begin(); it != open.end(); ++it) {
      fds.push_back({it->fd(), it->events(), 0});
      polled.push_back(it);
    }
    const int timeout_ms =
        wake_at == Clock::time_point::max()
            ? -1
            : static_cast<int>(std::min<int64_t>(
                  std::chrono::ceil<std::chrono::milliseconds>(wake_at - now).count(), INT32_MAX));
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      return;  // EFAULT, EINVAL, ENOMEM: nothing a later turn would fix
    }
    if (fds[0].revents != 0) return;
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents != 0 && !polled[i - 2]->Advance(body_, deadline)) {
        open.erase(polled[i - 2]);
      }
    }
    if ((fds[1].revents & POLLIN) == 0) continue;
    for (int i = 0; i < kAcceptsPerTurn; ++i) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Make room, or leave the rest in the backlog for a while.
          if (!open.empty()) {
            CloseOldestIdle(&open);
            continue;
          }
          accept_paused_until = Clock::now() + kOutOfDescriptorsPause;
        }
        break;  // EAGAIN: none left
      }
      if (open.size() >= max_connections_) CloseOldestIdle(&open);
      SSL* ssl = nullptr;
      if (ctx_ != nullptr) {
        ERR_clear_error();
        ssl = SSL_new(ctx_);
        if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
          ERR_clear_error();
          SSL_free(ssl);
          close(fd);
          continue;
        }
      }
      open.emplace_back(fd, ssl, Clock::now() + deadline);
    }
  }
}

}  // namespace downpour
