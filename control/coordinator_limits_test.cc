// CoordinatorState holds every request to spec/limits.h at its door (an
// in-process caller as much as the gRPC adapter): an oversized field is
// refused with one sentence and changes nothing; free text from nodes is
// cut, never refused; and what it sends out stays small — Tasks, ListJobs.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "control/coordinator_state_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/limits.h"

namespace downpour {
namespace control {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class CoordinatorLimitsTest : public CoordinatorStateTest {
 protected:
  // Job "j" of two workers a, b (ranks 0, 1) on shard s.
  void StartJob() {
    Register("s", SHARD);
    Register("a", WORKER);
    Register("b", WORKER);
    ASSERT_TRUE(state_->SubmitJob(SmallSpec(2, 1), "j").ok());
    ASSERT_EQ(StateOf("j"), RUNNING);
  }
};

TEST_F(CoordinatorLimitsTest, AnOversizedSpecIsRefusedAndNothingIsQueued) {
  Register("s", SHARD);
  Register("a", WORKER);
  JobSpec spec = SmallSpec(1, 1);
  spec.mutable_dataset()->set_train_files(std::string(1 << 20, 'f'));
  absl::StatusOr<JobStatus> job = state_->SubmitJob(spec, "big");
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message(),
            "dataset.train_files is 1048576 bytes; the limit is 4096 bytes (4 KiB)");
  spec = SmallSpec(1, 1);
  spec.mutable_dataset()->set_train_files("/etc/*");
  EXPECT_THAT(std::string(state_->SubmitJob(spec, "etc").status().message()),
              StartsWith("dataset.train_files \"/etc/*\" is an absolute path"));
  EXPECT_TRUE(state_->ListJobs()->empty());
  EXPECT_TRUE(stored_.jobs.empty());
  // The cluster goes on.
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "fine").ok());
  EXPECT_EQ(StateOf("fine"), RUNNING);
}

TEST_F(CoordinatorLimitsTest, EveryJobIdArgumentIsBounded) {
  StartJob();
  const std::string id(100000, 'j');
  const std::string message = "job_id is 100000 bytes; the limit is 64 bytes";
  EXPECT_EQ(state_->GetJob(id).status().message(), message);
  EXPECT_EQ(state_->WatchJob(id, 0, absl::ZeroDuration()).status().message(), message);
  EXPECT_EQ(state_->StopJob(id).status().message(), message);
  EXPECT_EQ(state_->CheckpointJob(id).status().message(), message);
  EXPECT_EQ(state_->ResumeJob(id).status().message(), message);
  EXPECT_EQ(state_->ExportJob(id, 0, false).status().message(), message);
  EXPECT_EQ(state_->DescribeJob(id).status().message(), message);
  EXPECT_EQ(state_->DeleteJob(id, false).message(), message);
  JobLogsRequest logs;
  logs.set_job_id(id);
  EXPECT_EQ(state_->JobLogs(logs).status().message(), message);
  EXPECT_EQ(state_->CordonNode(std::string(600, 'n'), true).status().message(),
            "node_id is 600 bytes; the limit is 512 bytes");
  SubmitJobRequest submit;
  *submit.mutable_spec() = SmallSpec(1, 1);
  submit.set_job_id(std::string(65, 'j'));
  EXPECT_EQ(state_->SubmitJob(submit).status().message(),
            "the job id is 65 bytes; the limit is 64 bytes");
  EXPECT_EQ(StateOf("j"), RUNNING);
}

TEST_F(CoordinatorLimitsTest, NodesWithOversizedRecordsDoNotRegister) {
  NodeInfo node;
  node.set_id("w");
  node.set_role(WORKER);
  node.set_address("w:1");
  for (int i = 0; i < 65; ++i) node.add_devices("cpu");
  EXPECT_EQ(state_->RegisterNode(node).status().message(),
            "node.devices has 65 entries; the limit is 64");
  EXPECT_TRUE(state_->ListNodes()->empty());
  HeartbeatRequest beat;
  beat.set_node_id(std::string(513, 'n'));
  EXPECT_EQ(state_->Heartbeat(beat).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorLimitsTest, LongLogLinesAndErrorsAreCutNotRefused) {
  StartJob();
  HeartbeatRequest beat;
  beat.set_node_id("a");
  beat.set_incarnation(1);
  JobLogLine* line = beat.add_logs();
  line->set_job_id("j");
  line->set_text(std::string(1 << 20, 'x'));
  ASSERT_TRUE(state_->Heartbeat(beat).ok());
  JobLogsRequest request;
  request.set_job_id("j");
  const JobLogsResponse logs = *state_->JobLogs(request);
  ASSERT_GE(logs.lines_size(), 1);
  const JobLogLine& kept = *logs.lines().rbegin();
  EXPECT_EQ(kept.source(), "a");
  EXPECT_LE(kept.text().size(), kMaxLogLineBytes);
  EXPECT_THAT(kept.text(), HasSubstr("bytes cut]"));

  ReportProgressRequest failed = Progress("j", "b", 1, 3);
  failed.set_error(std::string(1 << 20, 'e'));
  failed.set_permanent(true);
  ASSERT_TRUE(state_->ReportProgress(failed).ok());
  const JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.state(), FAILED);
  EXPECT_THAT(job.message(), StartsWith("worker 1 (b): eee"));
  EXPECT_LE(job.message().size(), kMaxMessageBytes + 20);
  for (const JobEvent& event : job.events()) EXPECT_LE(event.message().size(), kMaxEventBytes);
}

TEST_F(CoordinatorLimitsTest, DataListingsAreBounded) {
  StartJob();
  ReportProgressRequest listing = Progress("j", "a", 0, 0);
  listing.add_data_files("../../etc/passwd");
  EXPECT_THAT(std::string(state_->ReportProgress(listing).status().message()),
              StartsWith("data_files[0] \"../../etc/passwd\" has the component \"..\""));
  // One file of 4000 bytes for 2 workers: fine; 2100 such files are over the
  // listing's limit.
  listing.clear_data_files();
  for (int i = 0; i < 2100; ++i) listing.add_data_files(absl::StrCat(i, std::string(4000, 'f')));
  EXPECT_EQ(state_->ReportProgress(listing).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_->GetJob("j")->data_files_size(), 0);
  listing.clear_data_files();
  listing.add_data_files("train-0");
  ASSERT_TRUE(state_->ReportProgress(listing).ok());
  EXPECT_EQ(state_->GetJob("j")->data_files_size(), 1);
}

TEST_F(CoordinatorLimitsTest, DataSharesOfFewerFilesThanWorkersAreBounded) {
  Register("s", SHARD);
  for (int i = 0; i < 100; ++i) Register(absl::StrCat("w", i), WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(100, 1), "j").ok());
  ReportProgressRequest listing =
      Progress("j", state_->GetJob("j")->placement().worker_nodes(0), 0, 0);
  // 99 names of 4 KB: each of the 100 ranks would hold all of them (40 MB).
  for (int i = 0; i < 99; ++i) listing.add_data_files(absl::StrCat(i, std::string(4000, 'f')));
  EXPECT_THAT(std::string(state_->ReportProgress(listing).status().message()),
              StartsWith("the training data's shares would name "));
}

TEST_F(CoordinatorLimitsTest, ListJobsLeavesTheGrowingListsOut) {
  StartJob();
  ReportProgressRequest listing = Progress("j", "a", 0, 0);
  listing.add_data_files("train-0");
  listing.add_data_files("train-1");
  ASSERT_TRUE(state_->ReportProgress(listing).ok());
  const JobStatus full = *state_->GetJob("j");
  ASSERT_GT(full.placement().partitions_size(), 0);
  ASSERT_GT(full.events_size(), 0);
  ASSERT_GT(full.workers(0).data_size(), 0);
  const std::vector<JobStatus> listed = *state_->ListJobs();
  ASSERT_EQ(listed.size(), 1u);
  const JobStatus& summary = listed[0];
  EXPECT_EQ(summary.id(), "j");
  EXPECT_EQ(summary.spec().name(), full.spec().name());
  EXPECT_EQ(summary.state(), RUNNING);
  EXPECT_EQ(summary.placement().worker_nodes_size(), 2);
  EXPECT_EQ(summary.placement().partitions_size(), 0);
  EXPECT_EQ(summary.data_files_size(), 0);
  EXPECT_EQ(summary.workers_size(), 2);
  EXPECT_EQ(summary.workers(0).data_size(), 0);
  EXPECT_EQ(summary.events_size(), 0);
}

TEST_F(CoordinatorLimitsTest, ACheckpointPartNamingAnotherFileIsIgnored) {
  checkpoint_root_ = ::testing::TempDir() + "/coordinator_limits";
  Restart();
  Register("s", SHARD, 1, /*checkpoints=*/true);
  Register("a", WORKER);
  ASSERT_TRUE(state_->SubmitJob(SmallSpec(1, 1), "j").ok());
  HeartbeatRequest beat;
  beat.set_node_id("s");
  beat.set_incarnation(1);
  CheckpointPart* part = beat.add_checkpoints();
  part->set_job_id("j");
  part->set_step(5);
  part->set_attempt(1);
  part->mutable_file()->set_name("../../../etc/passwd");
  ASSERT_TRUE(state_->Heartbeat(beat).ok());
  ReportProgressRequest report = Progress("j", "a", 0, 5);
  report.mutable_checkpoint()->set_step(5);
  report.mutable_checkpoint()->set_attempt(1);
  report.mutable_checkpoint()->set_state("state");
  ASSERT_TRUE(state_->ReportProgress(report).ok());
  // Without the shard's own part the checkpoint is not complete: nothing
  // was read or given up.
  const JobStatus job = *state_->GetJob("j");
  EXPECT_EQ(job.checkpoints_size(), 0);
  for (const JobEvent& event : job.events()) {
    EXPECT_THAT(event.message(), ::testing::Not(HasSubstr("step 5"))) << event.message();
  }
}

}  // namespace
}  // namespace control
}  // namespace downpour
