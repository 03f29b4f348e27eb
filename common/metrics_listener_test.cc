#include "common/metrics_listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

extern char** environ;

namespace downpour {
namespace {

constexpr char kBody[] = "downpour_test_total 7\n";
constexpr char kGet[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
// What a scrape must take at most beside idle clients: half the deadline
// they are cut at, so that it cannot have waited for them.
constexpr absl::Duration kPromptly = absl::Seconds(1);

std::string TestDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  return absl::StrCat(base != nullptr ? base : "/tmp", "/metrics_listener_test");
}

// Runs argv with its output in a file; empty when it exits 0, else what it
// printed.
std::string RunCommand(const std::vector<std::string>& argv) {
  const std::string out = TestDir() + "/command.out";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return absl::StrCat("cannot run ", argv[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  char text[4096] = {};
  const int fd = open(out.c_str(), O_RDONLY);
  if (fd >= 0) {
    if (read(fd, text, sizeof(text) - 1) < 0) text[0] = '\0';
    close(fd);
  }
  return absl::StrCat(argv[0], " failed: ", text);
}

// One client connection to 127.0.0.1, blocking, with 10 s send and receive
// timeouts so that a broken server fails the test instead of hanging it.
class Client {
 public:
  // `receive_buffer` > 0: a receive buffer that small, set before
  // connecting (so the window the server sees is small too).
  explicit Client(int port, int receive_buffer = 0) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    const timeval limit{10, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
    if (receive_buffer > 0) {
      setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    connected_at_ = absl::Now();
  }
  ~Client() {
    SSL_free(ssl_);
    close(fd_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool connected() const { return connected_; }
  absl::Time connected_at() const { return connected_at_; }

  // The TLS handshake, trusting what `ctx` trusts and checking that the
  // certificate is 127.0.0.1's. Null `ctx`: plain, nothing to do.
  bool Handshake(SSL_CTX* ctx) {
    if (ctx == nullptr) return true;
    ssl_ = SSL_new(ctx);
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), "127.0.0.1");
    SSL_set_fd(ssl_, fd_);
    const bool ok = SSL_connect(ssl_) == 1;
    ERR_clear_error();
    return ok;
  }

  bool Send(const std::string& text) {
    if (ssl_ != nullptr) return SSL_write(ssl_, text.data(), static_cast<int>(text.size())) > 0;
    return send(fd_, text.data(), text.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(text.size());
  }

  // Everything it receives until the server closes (or an error).
  std::string ReadAll() {
    std::string text;
    char chunk[65536];
    for (;;) {
      const int n = ssl_ != nullptr ? SSL_read(ssl_, chunk, sizeof(chunk))
                                    : static_cast<int>(recv(fd_, chunk, sizeof(chunk), 0));
      if (n <= 0) break;
      text.append(chunk, static_cast<size_t>(n));
    }
    ERR_clear_error();
    return text;
  }

  // Whether the server's answer starts to arrive within 10 s: more bytes
  // wait unread than a TLS handshake leaves (its session tickets).
  bool AnswerArrives() {
    int bytes = 2048;
    setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof(bytes));
    pollfd p{fd_, POLLIN, 0};
    const bool arrived = poll(&p, 1, 10000) == 1;
    bytes = 1;
    setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof(bytes));
    return arrived;
  }

  // Whether the server closes the connection within `timeout`; what it
  // sends meanwhile is dropped unread (TLS records too).
  bool ClosedWithin(absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    char discard[65536];
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      const int ms =
          static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(end - absl::Now())));
      if (poll(&p, 1, ms) <= 0) return false;
      if (recv(fd_, discard, sizeof(discard), 0) <= 0) return true;
    }
  }

 private:
  const int fd_;
  SSL* ssl_ = nullptr;
  bool connected_ = false;
  absl::Time connected_at_;
};

// An answer larger than the socket buffers between the server and a client
// with a 4 KiB receive buffer hold (Linux grows a send buffer to 4 MiB at
// most by default: net.ipv4.tcp_wmem), so that the server cannot hand a
// client that reads nothing its whole answer.
std::string MoreThanTheSocketsHold() { return std::string(size_t{8} << 20, 'x'); }

struct Reply {
  bool connected = false;
  std::string text;  // the whole answer, head and body
  absl::Duration took;
};

// Sends `request` over a fresh connection and reads the answer.
Reply Ask(int port, SSL_CTX* ctx, const std::string& request = kGet) {
  Reply reply;
  const absl::Time start = absl::Now();
  Client client(port);
  reply.connected = client.connected() && client.Handshake(ctx) && client.Send(request);
  if (reply.connected) reply.text = client.ReadAll();
  reply.took = absl::Now() - start;
  return reply;
}

// Each test runs over plain HTTP and over TLS.
class MetricsListenerTest : public testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() {
    // A write to a connection the server has cut must fail, not kill us.
    signal(SIGPIPE, SIG_IGN);
    const std::string d = TestDir();
    mkdir(d.c_str(), 0700);
    *setup_error_ = RunCommand({"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                                "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                                "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                                "-keyout", d + "/key.pem", "-out", d + "/cert.pem"});
    client_ctx_ = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(client_ctx_, SSL_VERIFY_PEER, nullptr);
    if (setup_error_->empty() &&
        SSL_CTX_load_verify_locations(client_ctx_, (d + "/cert.pem").c_str(), nullptr) != 1) {
      *setup_error_ = "the client cannot load the test certificate";
    }
  }
  static void TearDownTestSuite() { SSL_CTX_free(client_ctx_); }

  void SetUp() override {
    if (GetParam() && !setup_error_->empty()) {
      GTEST_SKIP() << "no test certificate: " << *setup_error_;
    }
  }

  // Over TLS when the test's parameter says so; `body` answers /metrics.
  std::unique_ptr<MetricsListener> Start(
      MetricsListenerOptions options = {},
      std::function<std::string()> body = [] { return std::string(kBody); }) {
    options.host = "127.0.0.1";
    options.port = 0;
    if (GetParam()) {
      options.tls_cert_file = TestDir() + "/cert.pem";
      options.tls_key_file = TestDir() + "/key.pem";
    }
    auto listener = MetricsListener::Start(options, std::move(body));
    EXPECT_TRUE(listener.ok()) << listener.status();
    if (!listener.ok()) return nullptr;
    EXPECT_EQ((*listener)->tls(), GetParam());
    return std::move(*listener);
  }

  // The client's TLS context, or null for plain HTTP.
  SSL_CTX* client_ctx() const { return GetParam() ? client_ctx_ : nullptr; }

  // Connected clients that send nothing (not even a TLS hello).
  std::vector<std::unique_ptr<Client>> Idle(int port, int count) {
    std::vector<std::unique_ptr<Client>> clients;
    for (int i = 0; i < count; ++i) {
      clients.push_back(std::make_unique<Client>(port));
      EXPECT_TRUE(clients.back()->connected());
    }
    return clients;
  }

  // Clients that finish the handshake and send half a request head.
  std::vector<std::unique_ptr<Client>> HalfSent(int port, int count) {
    std::vector<std::unique_ptr<Client>> clients;
    for (int i = 0; i < count; ++i) {
      clients.push_back(std::make_unique<Client>(port));
      EXPECT_TRUE(clients.back()->connected());
      EXPECT_TRUE(clients.back()->Handshake(client_ctx()));
      EXPECT_TRUE(clients.back()->Send("GET /metrics HTTP/1.1\r\nHost: 127"));
    }
    return clients;
  }

  static std::string* setup_error_;
  static SSL_CTX* client_ctx_;
};

std::string* MetricsListenerTest::setup_error_ = new std::string;
SSL_CTX* MetricsListenerTest::client_ctx_ = nullptr;

TEST_P(MetricsListenerTest, AnswersGetMetricsAndClosesTheConnection) {
  auto listener = Start();
  ASSERT_NE(listener, nullptr);
  const Reply reply = Ask(listener->port(), client_ctx());
  ASSERT_TRUE(reply.connected);
  EXPECT_TRUE(absl::StartsWith(reply.text, "HTTP/1.1 200 OK\r\n")) << reply.text;
  EXPECT_TRUE(absl::StrContains(reply.text,
                                "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"))
      << reply.text;
  EXPECT_TRUE(absl::StrContains(reply.text, "\r\nConnection: close\r\n")) << reply.text;
  EXPECT_TRUE(absl::StrContains(reply.text, absl::StrCat("\r\nContent-Length: ", strlen(kBody))))
      << reply.text;
  EXPECT_TRUE(absl::EndsWith(reply.text, absl::StrCat("\r\n\r\n", kBody))) << reply.text;
}

TEST_P(MetricsListenerTest, AnswersAnythingElseWithAnError) {
  auto listener = Start();
  ASSERT_NE(listener, nullptr);
  struct Case {
    std::string request, status;
  };
  for (const Case& c : std::vector<Case>{
           {"GET /metrics?name[]=up HTTP/1.1\r\n\r\n", "200 OK"},
           {"GET /other HTTP/1.1\r\n\r\n", "404 Not Found"},
           {"GET / HTTP/1.0\r\n\r\n", "404 Not Found"},
           {"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "405 Method Not Allowed"},
           {"hello\r\n\r\n", "400 Bad Request"},
           {absl::StrCat("GET /metrics HTTP/1.1\r\nX: ", std::string(20000, 'x')),
            "431 Request Header Fields Too Large"},
       }) {
    const Reply reply = Ask(listener->port(), client_ctx(), c.request);
    ASSERT_TRUE(reply.connected) << c.request.substr(0, 40);
    EXPECT_TRUE(absl::StartsWith(reply.text, absl::StrCat("HTTP/1.1 ", c.status, "\r\n")))
        << c.request.substr(0, 40) << " -> " << reply.text;
    EXPECT_TRUE(absl::StrContains(reply.text, "\r\nConnection: close\r\n")) << reply.text;
  }
}

// Bytes after the head are read and dropped, not left to make the close a
// reset that could destroy the answer before the client reads it.
TEST_P(MetricsListenerTest, AnswersWhenMoreFollowsTheRequestHead) {
  auto listener = Start();
  ASSERT_NE(listener, nullptr);
  Client client(listener->port());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Handshake(client_ctx()));
  ASSERT_TRUE(client.Send(absl::StrCat(kGet, std::string(100000, 'x'))));
  absl::SleepFor(absl::Milliseconds(100));  // the server has answered and closed
  const std::string text = client.ReadAll();
  EXPECT_TRUE(absl::StartsWith(text, "HTTP/1.1 200 OK\r\n")) << text;
  EXPECT_TRUE(absl::EndsWith(text, kBody)) << text;
}

// Issue 23: two such clients kept civetweb's /metrics from everyone for 30 s.
TEST_P(MetricsListenerTest, IdleAndHalfSentRequestsDoNotHoldUpAScrape) {
  MetricsListenerOptions options;
  ASSERT_EQ(options.deadline, absl::Seconds(2));  // the default the daemons run with
  auto listener = Start(options);
  ASSERT_NE(listener, nullptr);
  std::vector<std::unique_ptr<Client>> waiting = Idle(listener->port(), 100);
  for (auto& client : HalfSent(listener->port(), 20)) waiting.push_back(std::move(client));

  const Reply reply = Ask(listener->port(), client_ctx());
  ASSERT_TRUE(reply.connected);
  EXPECT_TRUE(absl::StartsWith(reply.text, "HTTP/1.1 200 OK\r\n")) << reply.text;
  EXPECT_TRUE(absl::EndsWith(reply.text, kBody)) << reply.text;
  EXPECT_LT(reply.took, kPromptly);

  // The server closes each of them, and not before its deadline (which
  // starts at its accept, a little after the client's connect returns).
  for (const auto& client : waiting) {
    ASSERT_TRUE(client->ClosedWithin(absl::Seconds(10)));
    EXPECT_GE(absl::Now() - client->connected_at(), options.deadline - absl::Milliseconds(50));
  }
}

TEST_P(MetricsListenerTest, ASlowReaderDoesNotHoldUpAScrape) {
  // The slow client asks first and gets the big answer; the scrape gets the
  // small one, so that its time is the wait, not the copying.
  const std::string big = MoreThanTheSocketsHold();
  int calls = 0;  // on the loop thread only
  auto listener = Start({}, [&] { return calls++ == 0 ? big : std::string(kBody); });
  ASSERT_NE(listener, nullptr);
  Client slow(listener->port(), /*receive_buffer=*/4096);
  ASSERT_TRUE(slow.connected());
  ASSERT_TRUE(slow.Handshake(client_ctx()));
  ASSERT_TRUE(slow.Send(kGet));
  ASSERT_TRUE(slow.AnswerArrives());

  const Reply reply = Ask(listener->port(), client_ctx());
  ASSERT_TRUE(reply.connected);
  EXPECT_TRUE(absl::StartsWith(reply.text, "HTTP/1.1 200 OK\r\n")) << reply.text.substr(0, 200);
  EXPECT_TRUE(absl::EndsWith(reply.text, absl::StrCat("\r\n\r\n", kBody)))
      << reply.text.substr(0, 200);
  EXPECT_LT(reply.took, kPromptly);
}

TEST_P(MetricsListenerTest, CutsAClientThatDoesNotTakeItsAnswerInTime) {
  MetricsListenerOptions options;
  options.deadline = absl::Milliseconds(300);
  const std::string big = MoreThanTheSocketsHold();
  auto listener = Start(options, [&big] { return big; });
  ASSERT_NE(listener, nullptr);
  Client slow(listener->port(), /*receive_buffer=*/4096);
  ASSERT_TRUE(slow.connected());
  ASSERT_TRUE(slow.Handshake(client_ctx()));
  ASSERT_TRUE(slow.Send(kGet));
  absl::SleepFor(options.deadline + absl::Milliseconds(700));  // reads nothing meanwhile
  const std::string text = slow.ReadAll();
  EXPECT_TRUE(absl::StartsWith(text, "HTTP/1.1 200 OK\r\n")) << text.substr(0, 100);
  EXPECT_LT(text.size(), big.size());
}

TEST_P(MetricsListenerTest, AtTheLimitANewConnectionClosesTheOldestIdleOne) {
  MetricsListenerOptions options;
  options.max_connections = 4;
  options.deadline = absl::Seconds(60);  // only the limit closes anything here
  auto listener = Start(options);
  ASSERT_NE(listener, nullptr);
  std::vector<std::unique_ptr<Client>> idle = Idle(listener->port(), 4);

  const Reply reply = Ask(listener->port(), client_ctx());
  ASSERT_TRUE(reply.connected);
  EXPECT_TRUE(absl::EndsWith(reply.text, kBody)) << reply.text;
  EXPECT_TRUE(idle[0]->ClosedWithin(absl::Seconds(10)));
  for (size_t i = 1; i < idle.size(); ++i) {
    EXPECT_FALSE(idle[i]->ClosedWithin(absl::ZeroDuration())) << i;
  }
}

TEST_P(MetricsListenerTest, StopsQuicklyWithConnectionsOpen) {
  const std::string big = MoreThanTheSocketsHold();
  auto listener = Start({}, [&big] { return big; });
  ASSERT_NE(listener, nullptr);
  std::vector<std::unique_ptr<Client>> open = Idle(listener->port(), 50);
  for (auto& client : HalfSent(listener->port(), 10)) open.push_back(std::move(client));
  open.push_back(std::make_unique<Client>(listener->port(), /*receive_buffer=*/4096));
  ASSERT_TRUE(open.back()->Handshake(client_ctx()));
  ASSERT_TRUE(open.back()->Send(kGet));
  ASSERT_TRUE(open.back()->AnswerArrives());  // the server has taken them all

  const absl::Time start = absl::Now();
  listener.reset();
  EXPECT_LT(absl::Now() - start, kPromptly);
  for (const auto& client : open) EXPECT_TRUE(client->ClosedWithin(absl::Seconds(10)));
}

TEST_P(MetricsListenerTest, AnAddressInUseIsUnavailableAndNamed) {
  auto first = Start();
  ASSERT_NE(first, nullptr);
  MetricsListenerOptions options;
  options.host = "127.0.0.1";
  options.port = first->port();
  auto second = MetricsListener::Start(options, [] { return std::string(); });
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_TRUE(
      absl::StrContains(second.status().message(), absl::StrCat("127.0.0.1:", first->port())))
      << second.status();
}

INSTANTIATE_TEST_SUITE_P(PlainAndTls, MetricsListenerTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? "Tls" : "Plain";
                         });

}  // namespace
}  // namespace downpour
