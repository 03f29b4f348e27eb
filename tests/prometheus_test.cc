// deploy/prometheus/ against a live cluster, as an operator would run it: a
// real Prometheus (Debian's) with a copy of deploy/prometheus/prometheus.yml
// (only its intervals shortened) discovers every daemon through file_sd
// target files written from the coordinator's node list, scrapes them during
// a job, and serves deploy/'s console. Every target must be up; every query
// of the Grafana dashboard and of the console (deploy/panel_queries.py) must
// return data through the HTTP API, except those deploy/panels_no_data.yml
// allows to be empty, with its reason; and headless Chromium must render the
// console naming the running job and its step (the screenshot is kept in the
// test's outputs). Nothing is fed to Prometheus but the daemons' /metrics.
//
// Where network namespaces can be made (root, iproute2), every shard and
// worker runs in one of its own and every daemon listens on 0.0.0.0,
// shards and workers advertising their host's address, as on a multi-host
// cluster (the coordinator stays in this namespace, on the bridge the others
// reach it through); elsewhere everything runs on loopback. The test says
// which. Skipped, with the reason, without Prometheus, its console library
// or PyYAML; without Chromium, everything but the page is checked before the
// test reports itself skipped.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"
#include "tests/cluster_fixture.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

constexpr char kConsoleLibraries[] = "/usr/share/doc/prometheus/examples/console_libraries";
constexpr char kPython[] = "/usr/bin/python3";
constexpr char kJob[] = "scraped";

// `name` on PATH or in /usr/bin, or "" when there is none.
std::string FindProgram(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::vector<std::string> dirs = absl::StrSplit(path != nullptr ? path : "", ':');
  dirs.push_back("/usr/bin");
  for (const std::string& dir : dirs) {
    std::string candidate = absl::StrCat(dir, "/", name);
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// A loopback port nothing listens on now (Prometheus cannot report a port
// it picked itself).
int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::string UrlEncode(const std::string& text) {
  std::string out;
  for (const unsigned char c : text) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

// GET http://127.0.0.1:port/path in HTTP/1.0, so that Prometheus (Go's
// server) answers unchunked; the body of a 200, else an error with the
// start of the response.
absl::StatusOr<std::string> Get(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval timeout{/*tv_sec=*/20, /*tv_usec=*/0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to 127.0.0.1:", port));
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\n\r\n");
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("cannot send the request");
  }
  std::string response;
  char buffer[65536];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.0 200") && !absl::StartsWith(response, "HTTP/1.1 200")) {
    return absl::UnavailableError(absl::StrCat("GET ", path, ": ", response.substr(0, 300)));
  }
  if (body == std::string::npos) return absl::UnavailableError("no end of the headers");
  return response.substr(body + 4);
}

absl::StatusOr<Struct> ParseJson(const std::string& json) {
  Struct parsed;
  auto status = google::protobuf::util::JsonStringToMessage(json, &parsed);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not JSON: ", status.ToString(), ": ", json.substr(0, 300)));
  }
  return parsed;
}

// The field `key` of a JSON object (a null value when absent).
const Value& At(const Struct& object, const std::string& key) {
  static const Value* const kNull = new Value();
  auto found = object.fields().find(key);
  return found == object.fields().end() ? *kNull : found->second;
}
const Value& At(const Value& object, const std::string& key) {
  return At(object.struct_value(), key);
}

// One query of deploy/panel_queries.py.
struct PanelQuery {
  std::string where;         // "grafana / Step (A)".
  std::string expr;          // PromQL, ready for /api/v1/query.
  std::string may_be_empty;  // The allowlist's reason, or "".
};

class PrometheusTest : public ClusterFixture {
 protected:
  void SetUp() override {
    prometheus_ = FindProgram("prometheus");
    if (prometheus_.empty()) {
      GTEST_SKIP() << "prometheus not found on PATH or in /usr/bin: install Debian's prometheus "
                      "package (scripts/install-deps.sh does) to run deploy/prometheus/ against "
                      "a live cluster";
    }
    if (access(absl::StrCat(kConsoleLibraries, "/prom.lib").c_str(), R_OK) != 0) {
      GTEST_SKIP() << "no Prometheus console library in " << kConsoleLibraries
                   << " (Debian's prometheus package ships it there)";
    }
    if (RunCommand({kPython, "-c", "import yaml"}).exit_code != 0) {
      GTEST_SKIP() << kPython << " cannot import yaml, which deploy/panel_queries.py needs: "
                   << "install Debian's python3-yaml (scripts/install-deps.sh does)";
    }
    chromium_ = FindProgram("chromium");
  }

  void TearDown() override {
    if (prometheus_process_ != nullptr) prometheus_process_->Stop();
    ClusterFixture::TearDown();
  }

  // Every query of the dashboard and console, from deploy/panel_queries.py.
  std::vector<PanelQuery> PanelQueries() {
    CommandResult listed =
        RunCommand({kPython, Runfile("deploy/panel_queries.py"), "--format=json", "--check"});
    EXPECT_EQ(listed.exit_code, 0) << listed.err;
    absl::StatusOr<Struct> parsed = ParseJson(absl::StrCat("{\"queries\": ", listed.out, "}"));
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    std::vector<PanelQuery> queries;
    if (!parsed.ok()) return queries;
    for (const Value& q : At(*parsed, "queries").list_value().values()) {
      queries.push_back(
          {absl::StrCat(At(q, "source").string_value(), " / ", At(q, "panel").string_value(), " (",
                        At(q, "ref").string_value(), ")"),
           At(q, "expr").string_value(), At(q, "may_be_empty").string_value()});
    }
    return queries;
  }

  // file_sd target files, one per daemon, named to match prometheus.yml's
  // globs: the coordinator's metrics address, and every node's as the
  // coordinator lists it. Returns the addresses by scrape job.
  std::map<std::string, std::set<std::string>> WriteTargets(const std::string& dir) {
    std::map<std::string, std::set<std::string>> targets;
    std::string coordinator = cluster_->MetricsAddressOf("coordinator");
    if (absl::StartsWith(coordinator, "0.0.0.0:")) {
      // Listening everywhere: reached where its gRPC address is.
      const std::string& grpc = cluster_->coordinator_address();
      coordinator = grpc.substr(0, grpc.rfind(':')) + coordinator.substr(coordinator.rfind(':'));
    }
    targets["downpour-coordinator"].insert(coordinator);
    std::ofstream(dir + "/coordinator.yml") << "- targets: [\"" << coordinator << "\"]\n";

    CommandResult nodes = cluster_->Ctl({"-o", "json", "nodes"});
    EXPECT_EQ(nodes.exit_code, 0) << nodes.err;
    ListNodesResponse listed;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(
                    absl::StrCat("{\"nodes\": ", nodes.out, "}"), &listed)
                    .ok())
        << nodes.out;
    int n = 0;
    for (const NodeInfo& node : listed.nodes()) {
      const std::string kind = node.role() == SHARD ? "ps" : "worker";
      EXPECT_FALSE(node.metrics_address().empty()) << node.DebugString();
      targets["downpour-" + kind].insert(node.metrics_address());
      std::ofstream(absl::StrCat(dir, "/", kind, "-", n++, ".yml"))
          << "- targets: [\"" << node.metrics_address() << "\"]\n"
          << "  labels: {node: \"" << node.id() << "\"}\n";
    }
    return targets;
  }

  // Starts Prometheus on deploy/prometheus/prometheus.yml with every
  // interval 1 s, rules and console from deploy/, targets from
  // `dir`/targets, on a free loopback port.
  void StartPrometheus(const std::string& dir) {
    std::string config = ReadFile(Runfile("deploy/prometheus/prometheus.yml"));
    ASSERT_FALSE(config.empty()) << "deploy/prometheus/prometheus.yml is not in the runfiles";
    for (const char* line : {"scrape_interval: 15s", "scrape_timeout: 10s",
                             "evaluation_interval: 15s", "refresh_interval: 1m"}) {
      ASSERT_TRUE(absl::StrContains(config, line))
          << "prometheus.yml no longer says " << line << "; update this test";
    }
    config = absl::StrReplaceAll(config, {{"scrape_interval: 15s", "scrape_interval: 1s"},
                                          {"scrape_timeout: 10s", "scrape_timeout: 1s"},
                                          {"evaluation_interval: 15s", "evaluation_interval: 1s"},
                                          {"refresh_interval: 1m", "refresh_interval: 1s"}});
    std::ofstream(dir + "/prometheus.yml") << config;
    // Rule files are named relative to the configuration, as in deploy/.
    ASSERT_EQ(symlink(Runfile("deploy/prometheus/rules").c_str(), (dir + "/rules").c_str()), 0);

    for (int attempt = 0; attempt < 3; ++attempt) {
      port_ = FreeLoopbackPort();
      auto process = Process::Spawn(
          {prometheus_, absl::StrCat("--config.file=", dir, "/prometheus.yml"),
           absl::StrCat("--storage.tsdb.path=", dir, "/tsdb-", attempt),
           absl::StrCat("--web.listen-address=127.0.0.1:", port_),
           absl::StrCat("--web.console.templates=", Runfile("deploy/prometheus/consoles")),
           absl::StrCat("--web.console.libraries=", kConsoleLibraries)},
          dir + "/prometheus.log");
      ASSERT_TRUE(process.ok()) << process.status();
      prometheus_process_ = std::move(process).value();
      // Ready within a minute, or it exited (its port taken since it was
      // picked: try another).
      for (int i = 0; i < 600 && prometheus_process_->Running(); ++i) {
        if (Get(port_, "/-/ready").ok()) return;
        absl::SleepFor(absl::Milliseconds(100));
      }
      prometheus_process_->Stop();
    }
    FAIL() << "Prometheus never became ready:\n" << ReadFile(dir + "/prometheus.log");
  }

  // /api/v1/query of `expr`: the number of series (or 1 for a scalar).
  absl::StatusOr<int> Evaluate(const std::string& expr) {
    absl::StatusOr<std::string> body = Get(port_, "/api/v1/query?query=" + UrlEncode(expr));
    if (!body.ok()) return body.status();
    absl::StatusOr<Struct> json = ParseJson(*body);
    if (!json.ok()) return json.status();
    if (At(*json, "status").string_value() != "success") {
      return absl::InvalidArgumentError(*body);
    }
    const Value& data = At(*json, "data");
    const Value& result = At(data, "result");
    if (At(data, "resultType").string_value() == "scalar") return 1;
    return result.list_value().values_size();
  }

  // Runs headless Chromium on the console page with `mode` (--dump-dom, or
  // --screenshot=FILE).
  CommandResult Chromium(const std::string& mode) {
    const std::string home = MakeTempDir("chromium");
    std::vector<std::string> argv = {
        "/usr/bin/env", "HOME=" + home, "XDG_CONFIG_HOME=" + home, "XDG_CACHE_HOME=" + home,
        // Chromium forks helpers: bound it, then kill what is left.
        "/usr/bin/timeout", "-k", "5", "90", chromium_, "--headless", "--disable-gpu",
        "--disable-dev-shm-usage", "--no-first-run", "--user-data-dir=" + home + "/profile",
        "--window-size=1280,1600",
        // Lets the page's script draw its graph before the DOM is read.
        "--virtual-time-budget=5000", mode};
    // Chromium refuses to run as root in its sandbox.
    if (geteuid() == 0) argv.insert(argv.end() - 1, "--no-sandbox");
    // The graph over the last minute (prom_console.js reads its time range
    // from the fragment), where the job's few seconds of data show.
    argv.push_back(absl::StrCat("http://127.0.0.1:", port_, "/consoles/downpour.html#pctc",
                                UrlEncode(R"({"duration":60,"endTime":0})")));
    return RunCommand(argv, absl::Seconds(120));
  }

  std::string prometheus_;
  std::string chromium_;
  std::unique_ptr<Process> prometheus_process_;
  int port_ = 0;
};

TEST_F(PrometheusTest, ScrapesEveryDaemonAndEveryPanelAndTheConsoleShowTheRunningJob) {
  LocalCluster::Options options;
  options.shards = 2;
  options.workers = 2;
  const std::string why_not = LocalCluster::NetworkNamespacesUnavailable();
  options.network_namespaces = why_not.empty();
  options.wildcard_listen = why_not.empty();
  const std::string network =
      why_not.empty()
          ? "every daemon in a network namespace of its own (the coordinator too), "
            "listening on 0.0.0.0 and advertising its host's address"
          : absl::StrCat("every daemon on loopback (no network namespaces: ", why_not, ")");
  std::cout << "prometheus_test: " << network << std::endl;
  RecordProperty("network", network);
  StartCluster(options);
  ASSERT_FALSE(HasFatalFailure());

  // A job that outlasts the test (stopped at its end), evaluating the test
  // set as it goes so that the accuracy panels have data too.
  const std::string spec =
      absl::StrCat(FashionMlpSpec("ASYNC", 2, 2, 1000000), "eval_every_steps: 100\n");
  CommandResult submitted =
      cluster_->Ctl({"submit", WriteSpec(spec), absl::StrCat("--job_id=", kJob)});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  ASSERT_TRUE(AwaitJob(kJob, [](const JobStatus& j) {
    return j.state() == RUNNING && j.evaluations_size() > 0;
  })) << cluster_->Logs();

  const std::string dir = MakeTempDir("prometheus");
  ASSERT_EQ(mkdir((dir + "/targets").c_str(), 0755), 0);
  const std::map<std::string, std::set<std::string>> targets = WriteTargets(dir + "/targets");
  const std::map<std::string, size_t> daemons = {{"downpour-coordinator", 1},
                                                 {"downpour-ps", options.shards},
                                                 {"downpour-worker", options.workers}};
  for (const auto& [job, count] : daemons) {
    ASSERT_EQ(targets.count(job) ? targets.at(job).size() : 0, count) << job;
    for (const std::string& address : targets.at(job)) {
      std::cout << "prometheus_test: target " << job << " " << address << std::endl;
      if (options.wildcard_listen) {
        EXPECT_FALSE(absl::StartsWith(address, "127.") || absl::StartsWith(address, "0.0.0.0"))
            << job << " is scraped at " << address << ", not its host's address";
      }
    }
  }
  StartPrometheus(dir);
  ASSERT_FALSE(HasFatalFailure());

  // Every target up, each at the address written for it.
  std::string last;
  bool all_up = false;
  for (int i = 0; i < 600 && !all_up; ++i) {
    if (i > 0) absl::SleepFor(absl::Milliseconds(100));
    absl::StatusOr<std::string> body = Get(port_, "/api/v1/targets?state=active");
    if (!body.ok()) continue;
    last = *body;
    absl::StatusOr<Struct> json = ParseJson(*body);
    if (!json.ok()) continue;
    std::map<std::string, std::set<std::string>> up;
    int down = 0;
    for (const Value& t : At(At(*json, "data"), "activeTargets").list_value().values()) {
      if (At(t, "health").string_value() != "up") {
        ++down;
        continue;
      }
      up[At(t, "scrapePool").string_value()].insert(At(At(t, "labels"), "instance").string_value());
    }
    all_up = down == 0 && up == targets;
  }
  ASSERT_TRUE(all_up) << "not every target is up after a minute:\n"
                      << last << "\n"
                      << ReadFile(dir + "/prometheus.log");
  std::cout << "prometheus_test: all " << 1 + options.shards + options.workers << " targets up"
            << std::endl;

  // Every query of the dashboard and console returns data, but those the
  // allowlist excuses. Rates need two scrapes in their window: ask again
  // while some still return nothing, for at most a minute.
  const std::vector<PanelQuery> queries = PanelQueries();
  ASSERT_GT(queries.size(), 40u) << "deploy/panel_queries.py lists too few queries";
  std::map<std::string, int> series;
  std::map<std::string, std::string> errors;
  for (int round = 0; round < 60; ++round) {
    if (round > 0) absl::SleepFor(absl::Seconds(1));
    series.clear();
    errors.clear();
    bool missing = false;
    for (const PanelQuery& q : queries) {
      absl::StatusOr<int> n = Evaluate(q.expr);
      series[q.where] = n.value_or(0);
      if (!n.ok()) errors[q.where] = n.status().ToString();
      missing = missing || (q.may_be_empty.empty() && series[q.where] == 0);
    }
    if (!missing) break;
  }
  int with_data = 0, excused = 0;
  for (const PanelQuery& q : queries) {
    EXPECT_EQ(errors.count(q.where), 0u) << q.where << ": " << q.expr << ": " << errors[q.where];
    const int n = series[q.where];
    with_data += n > 0;
    if (n == 0 && !q.may_be_empty.empty()) ++excused;
    std::cout << "prometheus_test: " << (n > 0 ? absl::StrCat(n, " series") : "no data")
              << (n == 0 && !q.may_be_empty.empty() ? " (allowlisted)" : "") << "  " << q.where
              << std::endl;
    EXPECT_TRUE(n > 0 || !q.may_be_empty.empty())
        << q.where << " returned no data and is not in deploy/panels_no_data.yml: " << q.expr;
  }
  std::cout << "prometheus_test: " << queries.size() << " queries: " << with_data << " with data, "
            << excused << " empty and allowlisted" << std::endl;

  // The console in a browser: the running job, its state and a step.
  if (chromium_.empty()) {
    GTEST_SKIP() << "chromium not found on PATH or in /usr/bin: the console page was not loaded "
                    "in a browser (install Debian's chromium; scripts/install-deps.sh does). "
                    "Everything else above was checked.";
  }
  CommandResult dom = Chromium("--dump-dom");
  ASSERT_EQ(dom.exit_code, 0) << dom.err;
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string out_dir = outputs != nullptr ? outputs : dir;
  std::ofstream(out_dir + "/downpour-console.html") << dom.out;
  // The job's row of the jobs table: name, state, step, loss, test accuracy
  // (it has evaluated) and examples/s.
  const std::regex job_row(
      R"(^<td>[^<]*</td>\s*<td>RUNNING</td>\s*<td>(\d+)</td>\s*<td>([0-9.]+)</td>\s*)"
      R"(<td>([0-9.]+)</td>\s*<td>([^<]+)</td>)");
  const std::string cell = absl::StrCat("<td>", kJob, "</td>");
  std::smatch row;
  std::string from_cell;  // What row's submatches point into.
  bool found = false;
  for (size_t at = dom.out.find(cell); at != std::string::npos && !found;
       at = dom.out.find(cell, at + 1)) {
    from_cell = dom.out.substr(at, 400);
    found = std::regex_search(from_cell, row, job_row);
  }
  ASSERT_TRUE(found) << "the console's jobs table has no row for " << kJob
                     << " RUNNING with its step, loss and test accuracy:\n"
                     << dom.out;
  int64_t step = 0;
  double accuracy = 0;
  ASSERT_TRUE(absl::SimpleAtoi(row[1].str(), &step));
  ASSERT_TRUE(absl::SimpleAtod(row[3].str(), &accuracy));
  const JobStatus job = cluster_->GetJob(kJob);
  EXPECT_GT(step, 0);
  EXPECT_LE(step, job.step()) << "the console shows a step the job has not reached";
  EXPECT_GT(accuracy, 0.1) << "no better than chance";
  EXPECT_EQ(job.state(), RUNNING) << job.message();
  std::cout << "prometheus_test: the console shows " << kJob << " RUNNING at step " << step
            << ", loss " << row[2] << ", test accuracy " << row[3] << ", " << row[4]
            << " examples/s (the job is at step " << job.step() << ")" << std::endl;
  for (const char* text : {"downpour-coordinator", "downpour-ps", "downpour-worker"}) {
    EXPECT_TRUE(absl::StrContains(dom.out, absl::StrCat("<td>", text, "</td>"))) << text;
  }

  const std::string screenshot = out_dir + "/downpour-console.png";
  CommandResult shot = Chromium("--screenshot=" + screenshot);
  ASSERT_EQ(shot.exit_code, 0) << shot.err;
  const std::string png = ReadFile(screenshot);
  EXPECT_TRUE(absl::StartsWith(png, "\x89PNG")) << screenshot << " is no PNG";
  std::cout << "prometheus_test: screenshot " << screenshot << " (" << png.size() << " bytes)"
            << std::endl;
  ASSERT_EQ(cluster_->Ctl({"stop", kJob}).exit_code, 0);
}

}  // namespace
}  // namespace testing
}  // namespace downpour
