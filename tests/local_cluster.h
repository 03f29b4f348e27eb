// Test harness: starts the real Downpour daemons as processes on loopback
// (every port picked by the kernel, reported through --port_file), runs
// downpourctl against them, and stops everything it started on destruction.
// With Options::network_namespaces each shard and worker runs in a network
// namespace of its own, reached over a veth pair on a bridge that the
// coordinator listens on — hosts of a cluster in miniature, whose links a
// test cuts or throttles. Not thread-safe; one per test.
#ifndef DOWNPOUR_TESTS_LOCAL_CLUSTER_H_
#define DOWNPOUR_TESTS_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/job.pb.h"

namespace downpour {
namespace testing {

// Path of a file in the test's runfiles (e.g. "client/downpourctl").
std::string Runfile(const std::string& path);

// A fresh directory under TEST_TMPDIR.
std::string MakeTempDir(const std::string& name);

// A child process with stdout and stderr sent to a log file.
class Process {
 public:
  static absl::StatusOr<std::unique_ptr<Process>> Spawn(const std::vector<std::string>& argv,
                                                        const std::string& log_path);
  ~Process();

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  bool Running();
  // Sends `signal` on the test's behalf: an exit it causes is expected.
  void Signal(int signal);
  // True when the process exited on its own with a non-zero status or died
  // of a signal the test did not send (a crash).
  bool DiedUnexpectedly();
  // Waits up to `timeout` for the process to exit; returns its exit code, or
  // -signal when killed by a signal, or DeadlineExceeded.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // SIGTERM, then SIGKILL after `grace`; returns the exit code.
  int Stop(absl::Duration grace = absl::Seconds(5));
  std::string Log() const;

 private:
  Process(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_;
  std::string log_path_;
  void Kill(int signal);

  bool reaped_ = false;
  bool signalled_by_test_ = false;
  int exit_code_ = 0;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs a program to completion (killed after `timeout`), capturing output.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         absl::Duration timeout = absl::Seconds(120));

class LocalCluster {
 public:
  struct Options {
    int shards = 2;
    int workers = 2;
    std::string data_dir;  // Workers' --data_dir.
    int64_t heartbeat_interval_ms = 200;
    // Long enough that a loaded CI machine (tests run in parallel on 2
    // cores) does not starve a live node past it.
    int64_t node_timeout_ms = 4000;
    std::vector<std::string> worker_flags;
    std::vector<std::string> shard_flags;
    std::vector<std::string> coordinator_flags;
    // The coordinator's and every shard's --checkpoint_root (empty: none).
    std::string checkpoint_root;
    // Shards and workers in network namespaces of their own (needs root;
    // see NetworkNamespacesUnavailable), started with --shared_memory=false
    // as on separate hosts.
    bool network_namespaces = false;
    // With network_namespaces: every daemon, the coordinator too, on a host
    // (namespace) of its own, listening on every interface
    // (--listen=0.0.0.0:0, metrics too), shards and workers advertising
    // their host's address (--advertise), as on real hosts.
    bool wildcard_listen = false;
    // Certificates of scripts/make-certs.sh: every daemon serves and calls
    // over mutual TLS with DIR/NAME.crt and .key ("coordinator", "ps0",
    // "worker1"; shards and workers run with --node_id=NAME), the
    // coordinator authorizes with DIR/auth.pbtxt when it exists, and Ctl
    // trusts DIR/ca.crt. Empty: plaintext, open.
    std::string tls_dir;
    // Added to every downpourctl command line (e.g. --token_file=...).
    std::vector<std::string> ctl_flags;
  };

  // Why this process cannot make network namespaces ("" when it can).
  static std::string NetworkNamespacesUnavailable();

  explicit LocalCluster(Options options);
  ~LocalCluster();

  // Starts the coordinator, then the shards and workers, and waits until all
  // are serving.
  absl::Status Start();
  // Starts one more shard or worker (a replacement), named ps<N> / worker<N>.
  absl::Status AddShard();
  absl::Status AddWorker();

  const std::string& coordinator_address() const { return coordinator_address_; }
  const std::string& dir() const { return dir_; }
  Process* coordinator() { return coordinator_.get(); }
  Process* shard(int i) { return shards_[i].get(); }
  Process* worker(int i) { return workers_[i].get(); }
  // HOST:PORT of a daemon's gRPC and metrics servers.
  std::string AddressOf(const std::string& name) const;
  std::string MetricsAddressOf(const std::string& name) const;

  // Stops the coordinator (SIGTERM, or `signal`: SIGKILL) and, `down` later,
  // starts it again on the same address and state directory.
  absl::Status RestartCoordinator(absl::Duration down = absl::ZeroDuration(), int signal = 0);

  // With network_namespaces: takes the link of daemon `name` ("ps0",
  // "worker1") down or up, or limits it both ways to `rate` (tc tbf, e.g.
  // "1gbit"; "" removes the limit).
  absl::Status SetLink(const std::string& name, bool up);
  absl::Status Throttle(const std::string& name, const std::string& rate);

  // Runs downpourctl --coordinator=<this cluster> ARGS.
  CommandResult Ctl(const std::vector<std::string>& args,
                    absl::Duration timeout = absl::Seconds(180));

  // The job as `downpourctl -o json get ID` reports it; an empty JobStatus
  // when the command or its JSON fails (the test then fails on the fields).
  JobStatus GetJob(const std::string& id);

  // Stops every daemon with SIGTERM; returns the names of those that did not
  // exit 0, including any that crashed earlier in the test.
  std::vector<std::string> StopAll();

  // All daemon logs, for failure messages.
  std::string Logs() const;

 private:
  absl::StatusOr<std::unique_ptr<Process>> StartDaemon(const std::string& name,
                                                       const std::string& binary,
                                                       std::vector<std::string> flags);
  absl::Status StartCoordinator(const std::string& listen);
  // The address a new daemon `name` listens on: loopback, or (network
  // namespaces) a namespace made for it with its own address.
  absl::StatusOr<std::string> HostFor(const std::string& name);
  absl::Status SetUpBridge();
  void TearDownNetwork();

  struct Host {
    std::string netns;    // Network namespace.
    std::string veth;     // The bridge's end of its link.
    std::string inner;    // The namespace's end.
    std::string address;  // Its IPv4 address.
  };
  std::string bridge_;   // Empty: no network namespaces set up.
  std::string subnet_;   // "10.X.Y."
  std::string net_tag_;  // Unique per cluster, for names.
  std::map<std::string, Host> hosts_;

  const Options options_;
  const std::string dir_;
  std::string coordinator_address_;
  std::unique_ptr<Process> coordinator_;
  std::vector<std::unique_ptr<Process>> shards_;
  std::vector<std::unique_ptr<Process>> workers_;
};

// Imports the first `limit` Fashion-MNIST train and test examples into
// `data_dir`/fashion-mnist (once per directory).
absl::Status ImportFashionMnist(const std::string& data_dir, int64_t limit);

// A Fashion-MNIST MLP job spec (784-units-10, Adam) over the files
// ImportFashionMnist writes, in consistency `mode` (SYNC, ASYNC, SSP).
std::string FashionMlpSpec(const std::string& mode, int workers, int shards, int64_t steps,
                           int units = 128, int batch_size = 64);

// Reads a file whole ("" when missing).
std::string ReadFile(const std::string& path);

// Body of GET http://address/path over loopback.
absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path);

// The value of `series` (a metric name with its labels, as exposed:
// downpour_ps_jobs, or name{job="j",rank="1"}) in a /metrics exposition;
// 0 where it is not there.
double MetricValue(const std::string& exposition, const std::string& series);

}  // namespace testing
}  // namespace downpour

#endif  // DOWNPOUR_TESTS_LOCAL_CLUSTER_H_
