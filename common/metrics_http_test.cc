#include "common/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "gtest/gtest.h"

extern char** environ;

namespace downpour {
namespace {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

std::string TestDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  return absl::StrCat(base != nullptr ? base : "/tmp", "/metrics_http_test");
}

CommandResult Run(const std::vector<std::string>& argv) {
  const std::string out = absl::StrCat(TestDir(), "/command.out");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  CommandResult result;
  pid_t pid = 0;
  if (posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ) != 0) {
    posix_spawn_file_actions_destroy(&actions);
    result.output = absl::StrCat("cannot run ", argv[0]);
    return result;
  }
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream file(out);
  std::stringstream text;
  text << file.rdbuf();
  result.output = text.str();
  return result;
}

// Fetches URL with python3's urllib; trusts CA_FILE when given, else the
// system's roots. Prints the status and body, or ERROR and the exception.
constexpr char kFetch[] = R"(
import ssl, sys, urllib.request
ctx = ssl.create_default_context(cafile=sys.argv[2]) if len(sys.argv) > 2 else None
try:
    with urllib.request.urlopen(sys.argv[1], context=ctx, timeout=20) as r:
        print(r.status)
        print(r.read().decode())
except Exception as e:
    print("ERROR", type(e).__name__, e)
    sys.exit(1)
)";

CommandResult Fetch(const std::string& url, const std::string& ca_file = "") {
  std::vector<std::string> argv = {"python3", "-c", kFetch, url};
  if (!ca_file.empty()) argv.push_back(ca_file);
  return Run(argv);
}

std::string Openssl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  CommandResult r = Run(argv);
  return r.exit_code == 0 ? "" : absl::StrCat("openssl ", args[0], ": ", r.output);
}

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// A connection to the server at 127.0.0.1:PORT that sends nothing; -1 if
// it cannot connect.
int ConnectTo(const std::string& address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(std::stoi(address.substr(address.rfind(':') + 1)));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

class MetricsHttpTest : public testing::Test {
 protected:
  // Throwaway certificates: a self-signed one for 127.0.0.1, and a root CA
  // that signs an intermediate that signs a leaf for 127.0.0.1.
  static void SetUpTestSuite() {
    dir_ = new std::string(TestDir());
    mkdir(dir_->c_str(), 0700);
    const std::string& d = *dir_;
    const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt",
                                         "ec_paramgen_curve:prime256v1", "-nodes"};
    auto req = [&](std::vector<std::string> args) {
      std::vector<std::string> all = {"req"};
      all.insert(all.end(), ec.begin(), ec.end());
      all.insert(all.end(), args.begin(), args.end());
      return Openssl(all);
    };
    WriteFile(d + "/ca.ext",
              "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign\n"
              "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n");
    WriteFile(d + "/leaf.ext",
              "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\n"
              "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n");
    for (const std::string& error : {
             req({"-x509", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext",
                  "subjectAltName=IP:127.0.0.1", "-keyout", d + "/key.pem", "-out",
                  d + "/cert.pem"}),
             Openssl({"genpkey", "-algorithm", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                      "-out", d + "/other_key.pem"}),
             Openssl({"pkey", "-in", d + "/key.pem", "-aes256", "-passout", "pass:secret", "-out",
                      d + "/encrypted_key.pem"}),
             req({"-x509", "-days", "2", "-subj", "/CN=test root", "-keyout", d + "/root.key",
                  "-out", d + "/root.pem"}),
             req({"-subj", "/CN=test intermediate", "-keyout", d + "/inter.key", "-out",
                  d + "/inter.csr"}),
             Openssl({"x509", "-req", "-in", d + "/inter.csr", "-CA", d + "/root.pem", "-CAkey",
                      d + "/root.key", "-set_serial", "2", "-days", "2", "-extfile", d + "/ca.ext",
                      "-out", d + "/inter.pem"}),
             req({"-subj", "/CN=127.0.0.1", "-keyout", d + "/leaf.key", "-out", d + "/leaf.csr"}),
             Openssl({"x509", "-req", "-in", d + "/leaf.csr", "-CA", d + "/inter.pem", "-CAkey",
                      d + "/inter.key", "-set_serial", "3", "-days", "2", "-extfile",
                      d + "/leaf.ext", "-out", d + "/leaf.pem"}),
         }) {
      if (!error.empty() && setup_error_->empty()) *setup_error_ = error;
    }
    WriteFile(d + "/chain.pem", ReadFile(d + "/leaf.pem") + ReadFile(d + "/inter.pem"));
  }

  void SetUp() override {
    if (!setup_error_->empty()) GTEST_SKIP() << "no test certificates: " << *setup_error_;
    registry_.GetCounter("downpour_test_total", "A counter the test reads back.")->Increment(7);
  }

  static std::string Path(const std::string& name) { return *dir_ + "/" + name; }

  MetricsHttpOptions TlsOptions(const std::string& cert = "cert.pem",
                                const std::string& key = "key.pem") {
    MetricsHttpOptions options;
    options.listen = "127.0.0.1:0";
    options.tls_cert_file = Path(cert);
    options.tls_key_file = Path(key);
    return options;
  }

  MetricsRegistry registry_;
  static std::string* dir_;
  static std::string* setup_error_;
};

std::string* MetricsHttpTest::dir_ = nullptr;
std::string* MetricsHttpTest::setup_error_ = new std::string;

TEST_F(MetricsHttpTest, PlainHttpServesMetrics) {
  auto server = MetricsHttpServer::Start("127.0.0.1:0", &registry_);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_FALSE((*server)->tls());
  EXPECT_TRUE(absl::StartsWith((*server)->url(), "http://127.0.0.1:")) << (*server)->url();
  CommandResult r = Fetch((*server)->url());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(absl::StartsWith(r.output, "200\n")) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "downpour_test_total 7")) << r.output;
}

TEST_F(MetricsHttpTest, StartIfRequestedWithoutAnAddressServesNothing) {
  MetricsHttpOptions options;
  options.tls_cert_file = Path("cert.pem");
  options.tls_key_file = Path("key.pem");
  auto server = MetricsHttpServer::StartIfRequested(options, &registry_);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(*server, nullptr);
}

TEST_F(MetricsHttpTest, TlsServesMetricsToAClientTrustingTheCertificate) {
  auto server = MetricsHttpServer::Start(TlsOptions(), &registry_);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE((*server)->tls());
  ASSERT_TRUE(absl::StartsWith((*server)->url(), "https://127.0.0.1:")) << (*server)->url();
  CommandResult r = Fetch((*server)->url(), Path("cert.pem"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(absl::StartsWith(r.output, "200\n")) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "downpour_test_total 7")) << r.output;

  // A client that does not trust the certificate refuses it.
  r = Fetch((*server)->url());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "CERTIFICATE_VERIFY_FAILED")) << r.output;
}

TEST_F(MetricsHttpTest, TlsPortRefusesPlainHttp) {
  auto server = MetricsHttpServer::Start(TlsOptions(), &registry_);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string plain = absl::StrCat("http://", (*server)->address(), "/metrics");
  CommandResult r = Fetch(plain);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(absl::StartsWith(r.output, "ERROR")) << r.output;
  EXPECT_FALSE(absl::StrContains(r.output, "downpour_test_total")) << r.output;
}

TEST_F(MetricsHttpTest, TlsSendsTheIntermediateCertificates) {
  // The client trusts only the root: the server must send the intermediate.
  auto server = MetricsHttpServer::Start(TlsOptions("chain.pem", "leaf.key"), &registry_);
  ASSERT_TRUE(server.ok()) << server.status();
  CommandResult r = Fetch((*server)->url(), Path("root.pem"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "downpour_test_total 7")) << r.output;
}

TEST_F(MetricsHttpTest, TlsAnswersOnlyGetMetrics) {
  auto server = MetricsHttpServer::Start(TlsOptions(), &registry_);
  ASSERT_TRUE(server.ok()) << server.status();
  CommandResult r =
      Fetch(absl::StrCat("https://", (*server)->address(), "/other"), Path("cert.pem"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "HTTP Error 404")) << r.output;
}

// A client that connects and says nothing does not hold up shutdown.
TEST_F(MetricsHttpTest, TlsStopsWithASilentClientConnected) {
  auto server = MetricsHttpServer::Start(TlsOptions(), &registry_);
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = ConnectTo((*server)->address());
  ASSERT_GE(fd, 0);
  absl::SleepFor(absl::Milliseconds(200));  // the server is now in the handshake
  const absl::Time start = absl::Now();
  server->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  close(fd);
}

// Issue 23: two connections that sent nothing held civetweb's two threads,
// and every scrape with them, for 30 s. (common/metrics_listener_test times
// such a scrape; python3's start here is too slow to.)
TEST_F(MetricsHttpTest, IdleClientsDoNotKeepOthersFromMetrics) {
  for (const bool tls : {false, true}) {
    auto server = tls ? MetricsHttpServer::Start(TlsOptions(), &registry_)
                      : MetricsHttpServer::Start("127.0.0.1:0", &registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    std::vector<int> idle;
    for (int i = 0; i < 100; ++i) {
      idle.push_back(ConnectTo((*server)->address()));
      EXPECT_GE(idle.back(), 0);
    }
    CommandResult r = Fetch((*server)->url(), tls ? Path("cert.pem") : "");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "downpour_test_total 7")) << r.output;
    for (const int fd : idle) close(fd);
  }
}

TEST_F(MetricsHttpTest, TlsNeedsBothFiles) {
  MetricsHttpOptions options = TlsOptions();
  options.tls_key_file.clear();
  auto server = MetricsHttpServer::Start(options, &registry_);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(server.status().message(), "only the certificate"))
      << server.status();
  EXPECT_TRUE(absl::StrContains(server.status().message(), Path("cert.pem"))) << server.status();
}

TEST_F(MetricsHttpTest, BadTlsFilesFailNamingTheFile) {
  struct Case {
    std::string cert, key, says;
    absl::StatusCode code;
    std::string named;  // the file the message must name
  };
  WriteFile(Path("empty.pem"), "");
  for (const Case& c : std::vector<Case>{
           {"missing.pem", "key.pem", "cannot read the metrics TLS certificate",
            absl::StatusCode::kNotFound, "missing.pem"},
           {"cert.pem", "missing.pem", "cannot read the metrics TLS key",
            absl::StatusCode::kNotFound, "missing.pem"},
           {"key.pem", "key.pem", "holds no PEM certificate", absl::StatusCode::kInvalidArgument,
            "key.pem"},
           {"cert.pem", "empty.pem", "holds no PEM private key", absl::StatusCode::kInvalidArgument,
            "empty.pem"},
           {"cert.pem", "encrypted_key.pem", "is encrypted", absl::StatusCode::kInvalidArgument,
            "encrypted_key.pem"},
           {"cert.pem", "other_key.pem", "does not match the certificate",
            absl::StatusCode::kInvalidArgument, "other_key.pem"},
       }) {
    auto server = MetricsHttpServer::Start(TlsOptions(c.cert, c.key), &registry_);
    ASSERT_FALSE(server.ok()) << c.cert << " " << c.key;
    EXPECT_EQ(server.status().code(), c.code) << server.status();
    EXPECT_TRUE(absl::StrContains(server.status().message(), c.says)) << server.status();
    EXPECT_TRUE(absl::StrContains(server.status().message(), c.named)) << server.status();
  }
}

}  // namespace
}  // namespace downpour
