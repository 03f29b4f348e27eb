#include "tests/local_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/net_address.h"
#include "google/protobuf/util/json_util.h"

namespace downpour {
namespace testing {
namespace {

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

absl::StatusOr<std::string> WaitForPortFile(const std::string& path, Process* process,
                                            absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::string text(absl::StripAsciiWhitespace(ReadFile(path)));
    if (!text.empty()) return text;
    if (!process->Running()) {
      return absl::FailedPreconditionError(
          absl::StrCat("daemon exited before serving; log:\n", process->Log()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no port file ", path, "; log:\n", process->Log()));
}

constexpr char kIp[] = "/usr/sbin/ip";
constexpr char kTc[] = "/usr/sbin/tc";

// Runs a network administration command; an error carries its output.
absl::Status Admin(const std::vector<std::string>& argv) {
  CommandResult result = RunCommand(argv, absl::Seconds(20));
  if (result.exit_code == 0) return absl::OkStatus();
  std::string command;
  for (const std::string& a : argv) absl::StrAppend(&command, command.empty() ? "" : " ", a);
  return absl::InternalError(
      absl::StrCat("`", command, "` failed (", result.exit_code, "): ", result.out, result.err));
}

}  // namespace

std::string Runfile(const std::string& path) {
  return absl::StrCat(EnvOr("TEST_SRCDIR", "."), "/", EnvOr("TEST_WORKSPACE", "downpour"), "/",
                      path);
}

std::string MakeTempDir(const std::string& name) {
  static int counter = 0;
  const std::string dir =
      absl::StrCat(EnvOr("TEST_TMPDIR", "/tmp"), "/", name, "-", getpid(), "-", ++counter);
  mkdir(dir.c_str(), 0755);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::StatusOr<std::unique_ptr<Process>> Process::Spawn(const std::vector<std::string>& argv,
                                                        const std::string& log_path) {
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (log_fd < 0) return absl::InternalError(absl::StrCat("cannot open ", log_path));
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(log_fd);
  return std::unique_ptr<Process>(new Process(pid, log_path));
}

Process::~Process() {
  if (!reaped_) Stop(absl::Seconds(2));
}

bool Process::Running() {
  if (reaped_) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    reaped_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    return false;
  }
  return true;
}

void Process::Kill(int signal) {
  if (!reaped_) kill(pid_, signal);
}

void Process::Signal(int signal) {
  signalled_by_test_ = true;
  Kill(signal);
}

bool Process::DiedUnexpectedly() { return !Running() && exit_code_ != 0 && !signalled_by_test_; }

absl::StatusOr<int> Process::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (Running()) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("pid ", pid_, " still running"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return exit_code_;
}

int Process::Stop(absl::Duration grace) {
  Kill(SIGTERM);
  auto code = Wait(grace);
  if (code.ok()) return *code;
  Kill(SIGKILL);
  return Wait(absl::Seconds(10)).value_or(-SIGKILL);
}

std::string Process::Log() const { return ReadFile(log_path_); }

CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout) {
  const std::string dir = MakeTempDir("cmd");
  const std::string out_path = dir + "/out", err_path = dir + "/err";
  CommandResult result;
  const pid_t pid = fork();
  if (pid == 0) {
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (absl::Now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      result.err = "killed: timed out\n";
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  result.out = ReadFile(out_path);
  result.err += ReadFile(err_path);
  return result;
}

LocalCluster::LocalCluster(Options options)
    : options_(std::move(options)), dir_(MakeTempDir("cluster")) {}

LocalCluster::~LocalCluster() {
  StopAll();
  TearDownNetwork();
}

std::string LocalCluster::NetworkNamespacesUnavailable() {
  if (geteuid() != 0) return "creating network namespaces needs root";
  if (access(kIp, X_OK) != 0 || access(kTc, X_OK) != 0) {
    return absl::StrCat(kIp, " and ", kTc, " (iproute2) are needed to create network namespaces");
  }
  const std::string probe = absl::StrCat("dp-probe-", getpid());
  absl::Status added = Admin({kIp, "netns", "add", probe});
  if (!added.ok()) return std::string(added.message());
  Admin({kIp, "netns", "del", probe}).IgnoreError();
  return "";
}

absl::Status LocalCluster::SetUpBridge() {
  static int clusters = 0;
  ++clusters;
  net_tag_ = absl::StrCat(getpid() % 10000, "x", clusters % 100);
  subnet_ = absl::StrCat("10.", 200 + clusters % 50, ".", getpid() % 250 + 1, ".");
  const std::string bridge = absl::StrCat("d", net_tag_, "br");
  if (absl::Status s = Admin({kIp, "link", "add", bridge, "type", "bridge"}); !s.ok()) return s;
  bridge_ = bridge;
  // A bridge without an address of its own takes its lowest port's, so each
  // host added would change it under the others' ARP caches (cutting them
  // off from the coordinator for a minute): give it a fixed, local one.
  const int pid = getpid();
  const std::string mac =
      absl::StrFormat("02:d0:%02x:%02x:%02x:01", (pid >> 16) & 0xff, (pid >> 8) & 0xff, pid & 0xff);
  if (absl::Status s = Admin({kIp, "link", "set", bridge_, "address", mac}); !s.ok()) return s;
  if (absl::Status s = Admin({kIp, "addr", "add", subnet_ + "1/24", "dev", bridge_}); !s.ok()) {
    return s;
  }
  return Admin({kIp, "link", "set", bridge_, "up"});
}

absl::StatusOr<std::string> LocalCluster::HostFor(const std::string& name) {
  if (!options_.network_namespaces) return std::string("127.0.0.1");
  auto found = hosts_.find(name);
  if (found != hosts_.end()) return found->second.address;
  const int k = static_cast<int>(hosts_.size()) + 2;
  Host host;
  host.netns = absl::StrCat("dp-", net_tag_, "-", name);
  host.veth = absl::StrCat("d", net_tag_, "r", k);
  host.inner = absl::StrCat("d", net_tag_, "n", k);
  host.address = absl::StrCat(subnet_, k);
  hosts_[name] = host;
  const std::vector<std::vector<std::string>> steps = {
      {kIp, "netns", "add", host.netns},
      {kIp, "link", "add", host.veth, "type", "veth", "peer", "name", host.inner},
      {kIp, "link", "set", host.inner, "netns", host.netns},
      {kIp, "link", "set", host.veth, "master", bridge_},
      {kIp, "link", "set", host.veth, "up"},
      {kIp, "netns", "exec", host.netns, kIp, "addr", "add", host.address + "/24", "dev",
       host.inner},
      {kIp, "netns", "exec", host.netns, kIp, "link", "set", host.inner, "up"},
      {kIp, "netns", "exec", host.netns, kIp, "link", "set", "lo", "up"},
  };
  for (const std::vector<std::string>& step : steps) {
    if (absl::Status s = Admin(step); !s.ok()) return s;
  }
  return host.address;
}

absl::Status LocalCluster::SetLink(const std::string& name, bool up) {
  auto host = hosts_.find(name);
  if (host == hosts_.end()) return absl::NotFoundError(absl::StrCat("no host ", name));
  return Admin({kIp, "link", "set", host->second.veth, up ? "up" : "down"});
}

absl::Status LocalCluster::Throttle(const std::string& name, const std::string& rate) {
  auto host = hosts_.find(name);
  if (host == hosts_.end()) return absl::NotFoundError(absl::StrCat("no host ", name));
  // Both directions: the bridge's end shapes what the host receives, the
  // namespace's end what it sends.
  const std::vector<std::vector<std::string>> ends = {
      {kTc}, {kIp, "netns", "exec", host->second.netns, kTc}};
  for (std::vector<std::string> argv : ends) {
    const std::string dev = argv.size() == 1 ? host->second.veth : host->second.inner;
    if (rate.empty()) {
      argv.insert(argv.end(), {"qdisc", "del", "dev", dev, "root"});
    } else {
      argv.insert(argv.end(), {"qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst",
                               "256kb", "latency", "100ms"});
    }
    if (absl::Status s = Admin(argv); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void LocalCluster::TearDownNetwork() {
  for (const auto& [name, host] : hosts_) Admin({kIp, "netns", "del", host.netns}).IgnoreError();
  hosts_.clear();
  if (!bridge_.empty()) Admin({kIp, "link", "del", bridge_}).IgnoreError();
  bridge_.clear();
}

absl::StatusOr<std::unique_ptr<Process>> LocalCluster::StartDaemon(const std::string& name,
                                                                   const std::string& binary,
                                                                   std::vector<std::string> flags) {
  std::remove((dir_ + "/" + name + ".port").c_str());
  // The coordinator stays in this namespace, on the bridge, unless every
  // daemon listens on a wildcard: then it has a host of its own too.
  const bool wildcard = options_.wildcard_listen && options_.network_namespaces;
  const bool own_host = name != "coordinator" || wildcard;
  absl::StatusOr<std::string> host =
      own_host ? HostFor(name) : (bridge_.empty() ? std::string("127.0.0.1") : subnet_ + "1");
  if (!host.ok()) return host.status();
  std::vector<std::string> argv;
  if (own_host && options_.network_namespaces) {
    argv = {kIp, "netns", "exec", hosts_[name].netns};
  }
  argv.push_back(Runfile(binary));
  const std::string listen_host = wildcard ? "0.0.0.0" : *host;
  if (name != "coordinator") {
    argv.push_back(absl::StrCat("--listen=", listen_host, ":0"));
    if (wildcard) argv.push_back(absl::StrCat("--advertise=", *host));
  }
  argv.insert(argv.end(), flags.begin(), flags.end());
  // Off loopback (hosts on a bridge), plaintext is refused unless asked for.
  if (options_.network_namespaces && options_.tls_dir.empty()) argv.push_back("--insecure");
  if (const std::string& tls = options_.tls_dir; !tls.empty()) {
    argv.push_back(absl::StrCat("--tls_cert=", tls, "/", name, ".crt"));
    argv.push_back(absl::StrCat("--tls_key=", tls, "/", name, ".key"));
    argv.push_back(absl::StrCat("--tls_ca=", tls, "/ca.crt"));
    if (name != "coordinator") argv.push_back(absl::StrCat("--node_id=", name));
    if (name == "coordinator" && access((tls + "/auth.pbtxt").c_str(), R_OK) == 0) {
      argv.push_back(absl::StrCat("--auth_config=", tls, "/auth.pbtxt"));
    }
  }
  argv.push_back(absl::StrCat("--port_file=", dir_, "/", name, ".port"));
  argv.push_back(absl::StrCat("--metrics_listen=", listen_host, ":0"));
  return Process::Spawn(argv, dir_ + "/" + name + ".log");
}

absl::Status LocalCluster::StartCoordinator(const std::string& listen) {
  std::vector<std::string> flags = {
      absl::StrCat("--listen=", listen), absl::StrCat("--state_dir=", dir_, "/state"),
      absl::StrCat("--heartbeat_interval_ms=", options_.heartbeat_interval_ms),
      absl::StrCat("--node_timeout_ms=", options_.node_timeout_ms)};
  if (!options_.checkpoint_root.empty()) {
    flags.push_back(absl::StrCat("--checkpoint_root=", options_.checkpoint_root));
  }
  flags.insert(flags.end(), options_.coordinator_flags.begin(), options_.coordinator_flags.end());
  auto process = StartDaemon("coordinator", "coordinator/downpour-coordinator", flags);
  if (!process.ok()) return process.status();
  coordinator_ = std::move(process).value();
  auto address = WaitForPortFile(dir_ + "/coordinator.port", coordinator_.get(), absl::Seconds(30));
  if (!address.ok()) return address.status();
  coordinator_address_ = *address;
  if (options_.wildcard_listen && !bridge_.empty()) {
    // Listening everywhere on a host of its own: reached at that host's
    // address.
    coordinator_address_ = hosts_["coordinator"].address + address->substr(address->rfind(':'));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::Start() {
  if (options_.network_namespaces) {
    if (absl::Status s = SetUpBridge(); !s.ok()) return s;
  }
  absl::Status started = StartCoordinator(bridge_.empty()            ? "127.0.0.1:0"
                                          : options_.wildcard_listen ? "0.0.0.0:0"
                                                                     : subnet_ + "1:0");
  if (!started.ok()) return started;
  for (int i = 0; i < options_.shards; ++i) {
    absl::Status added = AddShard();
    if (!added.ok()) return added;
  }
  for (int i = 0; i < options_.workers; ++i) {
    absl::Status added = AddWorker();
    if (!added.ok()) return added;
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::AddShard() {
  std::vector<std::string> flags = {absl::StrCat("--coordinator=", coordinator_address_)};
  if (!options_.checkpoint_root.empty()) {
    flags.push_back(absl::StrCat("--checkpoint_root=", options_.checkpoint_root));
  }
  // Hosts in network namespaces share this kernel, but not their memory
  // on real hosts: their exchanges cross the links the tests cut and throttle.
  if (options_.network_namespaces) flags.push_back("--shared_memory=false");
  flags.insert(flags.end(), options_.shard_flags.begin(), options_.shard_flags.end());
  const std::string name = absl::StrCat("ps", shards_.size());
  auto process = StartDaemon(name, "server/downpour-ps", flags);
  if (!process.ok()) return process.status();
  shards_.push_back(std::move(process).value());
  return WaitForPortFile(absl::StrCat(dir_, "/", name, ".port"), shards_.back().get(),
                         absl::Seconds(30))
      .status();
}

absl::Status LocalCluster::AddWorker() {
  std::vector<std::string> flags = {absl::StrCat("--coordinator=", coordinator_address_),
                                    absl::StrCat("--data_dir=", options_.data_dir)};
  if (options_.network_namespaces) flags.push_back("--shared_memory=false");
  flags.insert(flags.end(), options_.worker_flags.begin(), options_.worker_flags.end());
  const std::string name = absl::StrCat("worker", workers_.size());
  auto process = StartDaemon(name, "worker/downpour-worker", flags);
  if (!process.ok()) return process.status();
  workers_.push_back(std::move(process).value());
  return WaitForPortFile(absl::StrCat(dir_, "/", name, ".port"), workers_.back().get(),
                         absl::Seconds(30))
      .status();
}

std::string LocalCluster::AddressOf(const std::string& name) const {
  return std::string(absl::StripAsciiWhitespace(ReadFile(dir_ + "/" + name + ".port")));
}

std::string LocalCluster::MetricsAddressOf(const std::string& name) const {
  // Daemons log "metrics on HOST:PORT".
  const std::string log = ReadFile(dir_ + "/" + name + ".log");
  const size_t at = log.find("metrics on ");
  if (at == std::string::npos) return "";
  const size_t start = at + 11;
  size_t end = log.find_first_of(", \n", start);
  const std::string logged = log.substr(start, end - start);
  // One listening on every interface (the coordinator logs where it
  // listens) is reached at its host's address.
  auto host = hosts_.find(name);
  if (host == hosts_.end() || !absl::StartsWith(logged, "0.0.0.0:")) return logged;
  return host->second.address + logged.substr(logged.rfind(':'));
}

absl::Status LocalCluster::RestartCoordinator(absl::Duration down, int signal) {
  if (signal != 0) {
    coordinator_->Signal(signal);
    if (!coordinator_->Wait(absl::Seconds(10)).ok()) {
      return absl::InternalError("the coordinator did not die");
    }
  } else if (const int code = coordinator_->Stop(); code != 0) {
    return absl::InternalError(absl::StrCat("coordinator exited with ", code));
  }
  absl::SleepFor(down);
  return StartCoordinator(coordinator_address_);
}

CommandResult LocalCluster::Ctl(const std::vector<std::string>& args, absl::Duration timeout) {
  std::vector<std::string> argv = {Runfile("client/downpourctl"),
                                   absl::StrCat("--coordinator=", coordinator_address_)};
  if (!options_.tls_dir.empty())
    argv.push_back(absl::StrCat("--tls_ca=", options_.tls_dir, "/ca.crt"));
  argv.insert(argv.end(), options_.ctl_flags.begin(), options_.ctl_flags.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, timeout);
}

JobStatus LocalCluster::GetJob(const std::string& id) {
  CommandResult result = Ctl({"-o", "json", "get", id});
  JobStatus job;
  if (result.exit_code != 0) return job;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  if (!google::protobuf::util::JsonStringToMessage(result.out, &job, options).ok()) {
    return JobStatus();
  }
  return job;
}

std::string FashionMlpSpec(const std::string& mode, int workers, int shards, int64_t steps,
                           int units, int batch_size) {
  return absl::StrCat(R"(
name: "mlp"
model {
  input_shape: [28, 28, 1]
  num_classes: 10
  layer { flatten {} }
  layer { dense { units: )",
                      units, R"( } }
  layer { relu {} }
  layer { dense { units: 10 } }
  layer { softmax_cross_entropy {} }
}
dataset {
  train_files: "fashion-mnist/train-*.tfrecord"
  test_files: "fashion-mnist/test-*.tfrecord"
  batch_size: )",
                      batch_size, R"(
  shuffle_buffer: 2000
}
optimizer { kind: ADAM learning_rate: 0.002 }
consistency { mode: )",
                      mode, " }\nnum_workers: ", workers, "\nnum_shards: ", shards,
                      "\nsteps: ", steps, "\nlog_every_steps: 5\nseed: 5\n");
}

std::vector<std::string> LocalCluster::StopAll() {
  std::vector<std::string> unclean;
  auto stop = [&](std::unique_ptr<Process>& p, const std::string& name) {
    if (p == nullptr) return;
    if (p->DiedUnexpectedly()) {
      unclean.push_back(absl::StrCat(name, " died during the test"));
    } else if (p->Running()) {
      const int code = p->Stop();
      if (code != 0) unclean.push_back(absl::StrCat(name, " exited ", code, " on SIGTERM"));
    }
  };
  for (size_t i = 0; i < workers_.size(); ++i) stop(workers_[i], absl::StrCat("worker", i));
  for (size_t i = 0; i < shards_.size(); ++i) stop(shards_[i], absl::StrCat("ps", i));
  stop(coordinator_, "coordinator");
  return unclean;
}

std::string LocalCluster::Logs() const {
  std::string out;
  auto add = [&](const std::unique_ptr<Process>& p) {
    if (p) absl::StrAppend(&out, "==== ", p->log_path(), "\n", p->Log());
  };
  add(coordinator_);
  for (const auto& p : shards_) add(p);
  for (const auto& p : workers_) add(p);
  return out;
}

absl::Status ImportFashionMnist(const std::string& data_dir, int64_t limit) {
  const std::string out = data_dir + "/fashion-mnist";
  struct stat st;
  if (stat(out.c_str(), &st) == 0) return absl::OkStatus();
  CommandResult result =
      RunCommand({Runfile("client/downpourctl"), "dataset", "import", "--out_dir=" + out,
                  "--shards=4", absl::StrCat("--limit=", limit)});
  if (result.exit_code != 0) {
    return absl::InternalError(absl::StrCat("dataset import failed: ", result.err));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path) {
  auto hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(hp->port);
  inet_pton(AF_INET, hp->host.c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to ", address));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: ", address, "\r\nConnection: close\r\n\r\n");
  (void)!write(fd, request.data(), request.size());
  std::string response;
  char buffer[65536];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.1 200", 0) != 0 || body == std::string::npos) {
    return absl::InternalError(absl::StrCat("bad HTTP response: ", response.substr(0, 200)));
  }
  return response.substr(body + 4);
}

double MetricValue(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::ConsumePrefix(&line, series) || !absl::ConsumePrefix(&line, " ")) continue;
    double value = 0;
    return absl::SimpleAtod(line, &value) ? value : 0;
  }
  return 0;
}

}  // namespace testing
}  // namespace downpour
