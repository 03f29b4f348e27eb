// Runs the downpourctl binary as a subprocess: usage and input errors, an
// unreachable coordinator, and the commands against an in-process fake
// Coordinator service.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/coordinator_service.grpc.pb.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string BinaryPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/downpour/client/downpourctl");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string WriteFile(const std::string& name, const std::string& contents) {
  const std::string path = absl::StrCat(TempDir(), "/", name);
  std::ofstream out(path);
  out << contents;
  return path;
}

// A started downpourctl; its stdout and stderr go to files.
struct Child {
  pid_t pid = -1;
  std::string stdout_path;
  std::string stderr_path;
  absl::Time start;
};

struct Result {
  int exit_code = -1;  // -1: killed after the time limit.
  std::string out;
  std::string err;
  absl::Duration took;
};

Child Start(const std::vector<std::string>& args) {
  static int counter = 0;
  ++counter;
  Child child;
  child.stdout_path = absl::StrCat(TempDir(), "/ctl", counter, ".out");
  child.stderr_path = absl::StrCat(TempDir(), "/ctl", counter, ".err");
  child.start = absl::Now();
  const std::string binary = BinaryPath();
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  child.pid = fork();
  if (child.pid == 0) {
    int out = open(child.stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(child.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err, 2);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  return child;
}

// Waits for the child to exit; kills it after `limit` (a hang is a failure).
Result Finish(const Child& child, absl::Duration limit = absl::Seconds(30)) {
  Result result;
  int status = 0;
  while (true) {
    pid_t done = waitpid(child.pid, &status, WNOHANG);
    if (done == child.pid) break;
    if (absl::Now() - child.start > limit) {
      kill(child.pid, SIGKILL);
      waitpid(child.pid, &status, 0);
      status = -1;
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  result.took = absl::Now() - child.start;
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  result.out = ReadFile(child.stdout_path);
  result.err = ReadFile(child.stderr_path);
  return result;
}

Result RunCtl(const std::vector<std::string>& args, absl::Duration limit = absl::Seconds(30)) {
  return Finish(Start(args), limit);
}

// ------------------------------------------------------- without a server

TEST(DownpourctlTest, NoArgumentsPrintsUsage) {
  Result r = RunCtl({});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("usage: downpourctl"));
}

TEST(DownpourctlTest, UnknownCommand) {
  Result r = RunCtl({"frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown command 'frobnicate'"));
}

TEST(DownpourctlTest, MissingJobId) {
  Result r = RunCtl({"get"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("downpourctl get JOB"));
}

TEST(DownpourctlTest, UnknownOutputFormat) {
  Result r = RunCtl({"-o", "xml", "list"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("'xml'"));
}

TEST(DownpourctlTest, BadCoordinatorAddress) {
  Result r = RunCtl({"--coordinator=nohost", "list"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--coordinator=nohost"));
}

TEST(DownpourctlTest, UnreachableCoordinatorFailsQuickly) {
  Result r = RunCtl({"--coordinator=127.0.0.1:1", "list"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, -1) << "hung";
  EXPECT_THAT(r.err, HasSubstr("cannot reach coordinator at 127.0.0.1:1"));
  EXPECT_LT(r.took, absl::Seconds(7));
}

TEST(DownpourctlTest, SubmitMissingFileNamesIt) {
  const std::string path = absl::StrCat(TempDir(), "/no_such_job.pbtxt");
  Result r = RunCtl({"--coordinator=127.0.0.1:1", "submit", path});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr(path));
  EXPECT_LT(r.took, absl::Seconds(3)) << "should not need the coordinator";
}

TEST(DownpourctlTest, SubmitParseErrorNamesLine) {
  const std::string path = WriteFile("typo.pbtxt", "name: \"a\"\nstepz: 3\n");
  Result r = RunCtl({"submit", path});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(path + ":2:"));
}

TEST(DownpourctlTest, DatasetImportMissingImagesNamesIt) {
  const std::string images = absl::StrCat(TempDir(), "/no-images-idx3-ubyte");
  const std::string labels = WriteFile("labels-idx1-ubyte", "");
  Result r = RunCtl({"dataset", "import", "--format=idx", absl::StrCat("--images=", images),
                     absl::StrCat("--labels=", labels),
                     absl::StrCat("--out_dir=", TempDir(), "/shards"), "--name=train"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, -1) << "hung";
  EXPECT_THAT(r.err, HasSubstr(images));
}

TEST(DownpourctlTest, DatasetImportNeedsOutDir) {
  Result r = RunCtl({"dataset", "import", "--fashion_mnist=/nonexistent"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--out_dir"));
}

TEST(DownpourctlTest, DatasetImportFashionMnist) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (access((dir + "/train-images-idx3-ubyte.gz").c_str(), R_OK) != 0) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  const std::string out_dir = absl::StrCat(TempDir(), "/fashion");
  Result r = RunCtl({"dataset", "import", "--fashion_mnist=" + dir, "--out_dir=" + out_dir,
                     "--shards=2", "--limit=50"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("train: wrote 50 examples to " + out_dir));
  EXPECT_THAT(r.out, HasSubstr("test: wrote 50 examples to " + out_dir));
  EXPECT_EQ(access((out_dir + "/train-00001-of-00002.tfrecord").c_str(), R_OK), 0);
  EXPECT_EQ(access((out_dir + "/test-00000-of-00002.tfrecord").c_str(), R_OK), 0);
}

TEST(DownpourctlTest, DatasetGenerateCtrWritesShardsAndSummary) {
  const std::string out_dir = absl::StrCat(TempDir(), "/ctr");
  Result r = RunCtl({"dataset", "generate", "--kind=ctr", "--out_dir=" + out_dir, "--name=clicks",
                     "--examples=20000", "--test_examples=2000", "--shards=2", "--seed=3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("clicks: wrote 20000 train and 2000 test examples to " + out_dir +
                               "/clicks-train-*-of-00002.tfrecord"));
  EXPECT_THAT(r.out, HasSubstr("test Bayes AUC 0."));
  for (const char* file :
       {"clicks-train-00000-of-00002.tfrecord", "clicks-train-00001-of-00002.tfrecord",
        "clicks-test-00000-of-00002.tfrecord", "clicks-test-00001-of-00002.tfrecord"}) {
    EXPECT_EQ(access(absl::StrCat(out_dir, "/", file).c_str(), R_OK), 0) << file;
  }
  const std::string json = ReadFile(out_dir + "/clicks.json");
  EXPECT_THAT(json, HasSubstr("\"seed\": 3,"));
  EXPECT_THAT(json, HasSubstr("\"train\": {\"examples\": 20000, \"clicks\": "));
  EXPECT_THAT(json, HasSubstr("\"test\": {\"examples\": 2000, \"clicks\": "));
  const size_t at = json.find("\"bayes_auc\": ");
  ASSERT_NE(at, std::string::npos) << json;
  const double auc = std::strtod(json.c_str() + at + 13, nullptr);
  EXPECT_GT(auc, 0.6);
  EXPECT_LT(auc, 0.95);
}

TEST(DownpourctlTest, DatasetGenerateBadFlagsExit2) {
  const std::string out_dir = absl::StrCat(TempDir(), "/ctr-bad");
  for (const auto& [flag, message] : std::vector<std::pair<std::string, std::string>>{
           {"--zipf=0", "--zipf=0 must be"},
           {"--kind=images", "--kind=images is not supported"},
           {"--vocabulary=10,20", "--vocabulary lists 2 values for 26 sparse features"},
           {"--examples=0", "--examples=0 must be"},
           {"--limit=5", "--limit is for dataset import"}}) {
    std::vector<std::string> args = {
        "dataset", "generate", "--kind=ctr", "--name=x", "--out_dir=" + out_dir, "--examples=10"};
    args.push_back(flag);
    Result r = RunCtl(args);
    EXPECT_EQ(r.exit_code, 2) << flag;
    EXPECT_THAT(r.err, HasSubstr(message)) << flag;
  }
}

// ------------------------------------------------------- a fake coordinator

// Jobs advance 100 steps per WatchJob from an up-to-date client; a job named
// "fail" fails at its last step; one named "ctr" is evaluated with AUC and
// log loss every 100 steps; one named "restarted" ends in its second
// attempt, begun 4 s after its first; a spec with no steps is rejected. While
// `stalled`, WatchJob holds (like a job making no progress).
class FakeCoordinator final : public Coordinator::Service {
 public:
  grpc::Status ListNodes(grpc::ServerContext*, const ListNodesRequest*,
                         ListNodesResponse* response) override {
    NodeInfo* node = response->add_nodes();
    node->set_id("worker-a");
    node->set_role(WORKER);
    node->set_address("10.0.0.7:7072");
    node->set_alive(true);
    node->set_last_heartbeat_ms(absl::ToUnixMillis(absl::Now()));
    node->add_devices("cuda:0 NVIDIA H100");
    node->add_devices("cuda:1 NVIDIA H100");
    return grpc::Status::OK;
  }

  grpc::Status SubmitJob(grpc::ServerContext*, const SubmitJobRequest* request,
                         SubmitJobResponse* response) override {
    if (request->spec().steps() <= 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "steps must be positive");
    }
    absl::MutexLock lock(&mu_);
    JobStatus job;
    job.set_id(request->job_id().empty() ? absl::StrCat("job-", next_id_++) : request->job_id());
    *job.mutable_spec() = request->spec();
    job.set_state(RUNNING);
    job.set_test_accuracy(-1);
    job.set_submit_time_ms(absl::ToUnixMillis(absl::Now()));
    job.set_start_time_ms(job.submit_time_ms());
    job.set_first_start_time_ms(job.start_time_ms());
    job.set_attempt(1);
    job.set_version(1);
    jobs_.push_back(job);
    *response->mutable_job() = job;
    return grpc::Status::OK;
  }

  grpc::Status ListJobs(grpc::ServerContext*, const ListJobsRequest*,
                        ListJobsResponse* response) override {
    absl::MutexLock lock(&mu_);
    for (const JobStatus& job : jobs_) *response->add_jobs() = job;
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext*, const GetJobRequest* request,
                      JobStatus* response) override {
    absl::MutexLock lock(&mu_);
    JobStatus* job = Find(request->job_id());
    if (job == nullptr) return NotFound(request->job_id());
    *response = *job;
    return grpc::Status::OK;
  }

  grpc::Status WatchJob(grpc::ServerContext* context, const WatchJobRequest* request,
                        JobStatus* response) override {
    absl::MutexLock lock(&mu_);
    JobStatus* job = Find(request->job_id());
    if (job == nullptr) return NotFound(request->job_id());
    ++watch_calls_;
    const absl::Time until = absl::Now() + absl::Milliseconds(request->timeout_ms());
    while (stalled_ && absl::Now() < until && !context->IsCancelled()) {
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](bool* s) { return !*s; }, &stalled_),
                           absl::Milliseconds(50));
    }
    if (!stalled_ && request->known_version() >= job->version() && job->state() == RUNNING) {
      Advance(job);
    }
    *response = *job;
    return grpc::Status::OK;
  }

  grpc::Status StopJob(grpc::ServerContext*, const StopJobRequest* request,
                       StopJobResponse* response) override {
    absl::MutexLock lock(&mu_);
    JobStatus* job = Find(request->job_id());
    if (job == nullptr) return NotFound(request->job_id());
    job->set_state(STOPPED);
    job->set_message("stopped by the operator");
    job->set_version(job->version() + 1);
    *response->mutable_job() = *job;
    return grpc::Status::OK;
  }

  void set_stalled(bool stalled) {
    absl::MutexLock lock(&mu_);
    stalled_ = stalled;
  }

  // 100 steps of job `id`, as an up-to-date watcher would see them.
  void AdvanceJob(const std::string& id) {
    absl::MutexLock lock(&mu_);
    JobStatus* job = Find(id);
    ASSERT_NE(job, nullptr) << id;
    Advance(job);
  }

 private:
  void Advance(JobStatus* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    job->set_step(std::min(job->step() + 100, job->spec().steps()));
    job->set_loss(1.0f / job->step());
    job->set_examples_per_sec(1234);
    job->set_version(job->version() + 1);
    if (job->spec().name() == "ctr") {
      const bool last = job->step() == job->spec().steps();
      Evaluation* evaluation = job->add_evaluations();
      evaluation->set_step(job->step());
      evaluation->set_accuracy(0.85);
      evaluation->set_auc(last ? 0.7981 : 0.75);
      evaluation->set_log_loss(last ? 0.441 : 0.5);
      evaluation->set_time_ms(job->submit_time_ms() + 1000);
      job->set_test_auc(evaluation->auc());
      job->set_test_log_loss(evaluation->log_loss());
    }
    if (job->step() == job->spec().steps()) {
      if (job->spec().name() == "restarted") {
        job->set_start_time_ms(job->first_start_time_ms() + 4000);
        job->set_attempt(2);
        job->set_restarts(1);
      }
      job->set_end_time_ms(job->start_time_ms() + 2500);
      if (job->spec().name() == "fail") {
        job->set_state(FAILED);
        job->set_message("worker 0: loss became NaN at step 300");
      } else {
        job->set_state(SUCCEEDED);
        job->set_test_accuracy(0.85);
      }
    }
  }

  JobStatus* Find(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (JobStatus& job : jobs_) {
      if (job.id() == id) return &job;
    }
    return nullptr;
  }

  static grpc::Status NotFound(const std::string& id) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("job ", id, " not found"));
  }

  absl::Mutex mu_;
  std::vector<JobStatus> jobs_ ABSL_GUARDED_BY(mu_);
  int next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int watch_calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool stalled_ ABSL_GUARDED_BY(mu_) = false;
};

class DownpourctlServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer("127.0.0.1:0"); }
  void TearDown() override { StopServer(); }

  void StartServer(const std::string& listen) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = absl::StrCat("127.0.0.1:", port);
  }

  void StopServer() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    server_->Wait();
    server_.reset();
  }

  std::string Flag() const { return absl::StrCat("--coordinator=", address_); }

  std::string JobFile(const std::string& name, int steps) {
    return WriteFile(absl::StrCat(name, ".pbtxt"),
                     absl::StrCat("name: \"", name, "\"\nsteps: ", steps, "\nnum_workers: 1\n"));
  }

  FakeCoordinator service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(DownpourctlServerTest, NodesTable) {
  Result r = RunCtl({Flag(), "nodes"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("ID"));
  EXPECT_THAT(r.out, HasSubstr("LAST_HEARTBEAT"));
  EXPECT_THAT(r.out, HasSubstr("worker-a"));
  EXPECT_THAT(r.out, HasSubstr("WORKER"));
  EXPECT_THAT(r.out, HasSubstr("cuda:0 NVIDIA H100,cuda:1 NVIDIA H100"));
}

TEST_F(DownpourctlServerTest, NodesJsonIsAnArray) {
  Result r = RunCtl({Flag(), "nodes", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.front(), '[');
  EXPECT_THAT(r.out, HasSubstr("\"role\": \"WORKER\""));
  EXPECT_THAT(r.out, HasSubstr("\"last_heartbeat_ms\""));
}

TEST_F(DownpourctlServerTest, SubmitPrintsIdThenListAndGet) {
  Result submit = RunCtl({Flag(), "submit", JobFile("mnist", 300), "--job_id=my-job"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  EXPECT_EQ(submit.out, "my-job\n");

  Result list = RunCtl({Flag(), "list"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr("STEP/STEPS"));
  EXPECT_THAT(list.out, HasSubstr("my-job"));
  EXPECT_THAT(list.out, HasSubstr("0/300"));

  for (const char* o : {"-o=json", "--output=json"}) {
    Result json = RunCtl({Flag(), o, "list"});
    ASSERT_EQ(json.exit_code, 0) << json.err;
    EXPECT_EQ(json.out.front(), '[') << o;
    EXPECT_THAT(json.out, HasSubstr("\"id\": \"my-job\"")) << o;
    EXPECT_THAT(json.out, HasSubstr("\"state\": \"RUNNING\"")) << o;
    EXPECT_THAT(json.out, HasSubstr("\"test_accuracy\"")) << o;
    EXPECT_THAT(json.out, HasSubstr("\"step\"")) << o;
  }

  Result get = RunCtl({Flag(), "get", "my-job"});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("my-job"));
  EXPECT_THAT(get.out, HasSubstr("RUNNING"));
  EXPECT_THAT(get.out, HasSubstr("0/300"));

  Result missing = RunCtl({Flag(), "get", "nope"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("job nope not found"));
}

TEST_F(DownpourctlServerTest, SubmitRejectedSpecExits2WithMessage) {
  Result r = RunCtl({Flag(), "submit", JobFile("nosteps", 0)});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("steps must be positive"));
}

TEST_F(DownpourctlServerTest, SubmitAndWaitSucceeds) {
  Result r = RunCtl({Flag(), "submit", JobFile("mnist", 300), "--wait"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("RUNNING step 100/300 loss 0.010 1234 ex/s"));
  EXPECT_EQ(r.out,
            "job job-1 SUCCEEDED steps=300 test_accuracy=0.8500 "
            "wall_s=2.5\n");
}

// wall_s is the whole job's, from its first start; a job that restarted
// also shows its last attempt's time (one that did not: no more than
// wall_s, as above).
TEST_F(DownpourctlServerTest, ARestartedJobShowsItsWholeWallTimeAndItsLastAttempts) {
  Result r = RunCtl({Flag(), "submit", JobFile("restarted", 300), "--wait"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "job job-1 SUCCEEDED steps=300 test_accuracy=0.8500 "
            "wall_s=6.5 last_attempt_s=2.5\n");
  Result wait = RunCtl({Flag(), "wait", "job-1"});
  ASSERT_EQ(wait.exit_code, 0) << wait.err;
  EXPECT_EQ(wait.out, r.out);
  Result get = RunCtl({Flag(), "get", "job-1"});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("wall time:      6.5s\n"));
  EXPECT_THAT(get.out, HasSubstr("last attempt:   2.5s (attempt 2)\n"));

  ASSERT_EQ(RunCtl({Flag(), "submit", JobFile("mnist", 300), "--job_id=once", "--wait"}).exit_code,
            0);
  get = RunCtl({Flag(), "get", "once"});
  EXPECT_THAT(get.out, HasSubstr("wall time:      2.5s\n"));
  EXPECT_THAT(get.out, Not(HasSubstr("last attempt")));
}

TEST_F(DownpourctlServerTest, AucAndLogLossShowWhereTheJobHasThem) {
  ASSERT_EQ(RunCtl({Flag(), "submit", JobFile("ctr", 200), "--job_id=ctr-1"}).exit_code, 0);
  // One evaluation in: the latest's figures, not yet the job's result.
  service_.AdvanceJob("ctr-1");
  Result get = RunCtl({Flag(), "get", "ctr-1"});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("test accuracy:  -\n"));
  EXPECT_THAT(get.out, HasSubstr("test AUC:       0.7500 (latest evaluation)\n"));
  EXPECT_THAT(get.out, HasSubstr("test log loss:  0.5000 (latest evaluation)\n"));
  EXPECT_THAT(get.out, HasSubstr("  step 100  accuracy 0.8500  AUC 0.7500  log loss 0.5000  at "));
  Result list = RunCtl({Flag(), "list"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_THAT(list.out, Not(HasSubstr("TEST_AUC")));  // No job has a final AUC yet.

  Result wait = RunCtl({Flag(), "wait", "ctr-1"});
  ASSERT_EQ(wait.exit_code, 0) << wait.err;
  EXPECT_EQ(wait.out,
            "job ctr-1 SUCCEEDED steps=200 test_accuracy=0.8500 test_auc=0.7981 "
            "test_log_loss=0.4410 wall_s=2.5\n");
  get = RunCtl({Flag(), "get", "ctr-1"});
  EXPECT_THAT(get.out, HasSubstr("test AUC:       0.7981\n"));
  EXPECT_THAT(get.out, HasSubstr("test log loss:  0.4410\n"));
  EXPECT_THAT(get.out, HasSubstr("  step 200  accuracy 0.8500  AUC 0.7981  log loss 0.4410  at "));
  ASSERT_EQ(RunCtl({Flag(), "submit", JobFile("mnist", 300), "--job_id=mnist-1"}).exit_code, 0);
  list = RunCtl({Flag(), "list"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr("TEST_ACC  TEST_AUC  AGE"));
  EXPECT_THAT(list.out, ::testing::ContainsRegex("ctr-1 .* 0\\.8500 +0\\.7981 "));
  EXPECT_THAT(list.out, ::testing::ContainsRegex("mnist-1 .* - +- "));
  get = RunCtl({Flag(), "get", "mnist-1"});
  EXPECT_THAT(get.out, Not(HasSubstr("AUC")));
}

TEST_F(DownpourctlServerTest, WaitJsonPrintsTheJob) {
  ASSERT_EQ(RunCtl({Flag(), "submit", JobFile("mnist", 200)}).exit_code, 0);
  Result r = RunCtl({Flag(), "-o", "json", "wait", "job-1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.front(), '{');
  EXPECT_THAT(r.out, HasSubstr("\"state\": \"SUCCEEDED\""));
}

TEST_F(DownpourctlServerTest, WaitForFailedJobExits1WithMessage) {
  ASSERT_EQ(RunCtl({Flag(), "submit", JobFile("fail", 300)}).exit_code, 0);
  Result r = RunCtl({Flag(), "wait", "job-1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("job job-1 FAILED steps=300"));
  EXPECT_THAT(r.err, HasSubstr("loss became NaN"));
}

TEST_F(DownpourctlServerTest, StopThenWaitExits1) {
  ASSERT_EQ(RunCtl({Flag(), "submit", JobFile("mnist", 300)}).exit_code, 0);
  Result stop = RunCtl({Flag(), "stop", "job-1"});
  ASSERT_EQ(stop.exit_code, 0) << stop.err;
  EXPECT_EQ(stop.out, "job job-1 STOPPED\n");
  Result wait = RunCtl({Flag(), "wait", "job-1"});
  EXPECT_EQ(wait.exit_code, 1);
  EXPECT_THAT(wait.out, HasSubstr("STOPPED"));
  EXPECT_THAT(wait.err, HasSubstr("stopped by the operator"));
}

TEST_F(DownpourctlServerTest, WaitTimeoutExits3) {
  ASSERT_EQ(RunCtl({Flag(), "submit", JobFile("mnist", 300)}).exit_code, 0);
  service_.set_stalled(true);
  Result r = RunCtl({Flag(), "wait", "job-1", "--timeout=1s"});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, HasSubstr("job-1 did not end within --timeout=1s"));
  EXPECT_LT(r.took, absl::Seconds(5));
}

TEST_F(DownpourctlServerTest, WaitSurvivesCoordinatorRestart) {
  ASSERT_EQ(RunCtl({Flag(), "submit", JobFile("mnist", 300)}).exit_code, 0);
  service_.set_stalled(true);
  const std::string flag = Flag();
  Child child = Start({flag, "wait", "job-1"});
  absl::SleepFor(absl::Milliseconds(500));
  StopServer();
  absl::SleepFor(absl::Seconds(1));
  service_.set_stalled(false);
  StartServer(address_);
  Result r = Finish(child);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("lost the coordinator at " + address_));
  EXPECT_THAT(r.err, HasSubstr("reconnected"));
  EXPECT_THAT(r.out, HasSubstr("job job-1 SUCCEEDED"));
}

TEST_F(DownpourctlServerTest, WaitGivesUpWhenCoordinatorStaysAway) {
  ASSERT_EQ(RunCtl({Flag(), "submit", JobFile("mnist", 300)}).exit_code, 0);
  service_.set_stalled(true);
  Child child = Start({Flag(), "wait", "job-1", "--reconnect_timeout=2s"});
  absl::SleepFor(absl::Milliseconds(500));
  StopServer();
  Result r = Finish(child);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("lost the coordinator at " + address_ +
                               " while waiting for job job-1 and could not "
                               "reconnect within 2s"));
  EXPECT_LT(r.took, absl::Seconds(10));
}

}  // namespace
}  // namespace downpour
