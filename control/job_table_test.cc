#include "control/job_table.h"

#include <thread>

#include "control/memory_job_store.h"
#include "gtest/gtest.h"

namespace downpour {
namespace control {
namespace {

class JobTableTest : public ::testing::Test {
 protected:
  JobTable::Options Options() {
    JobTable::Options options;
    options.progress_persist_interval = absl::Seconds(2);
    options.now = [this] { return now_; };
    return options;
  }

  static JobStatus Job(const std::string& id, JobState state = PENDING) {
    JobStatus job;
    job.set_id(id);
    job.set_state(state);
    return job;
  }

  const JobStatus* Stored(const std::string& id) {
    for (const JobStatus& job : data_.jobs) {
      if (job.id() == id) return &job;
    }
    return nullptr;
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  MemoryJobStore::Data data_;
  MemoryJobStore store_{&data_};
};

TEST_F(JobTableTest, JobsKeepTheirOrderAndVersions) {
  JobTable table(Options(), &store_);
  ASSERT_TRUE(table.Insert(Job("b")).ok());
  ASSERT_TRUE(table.Insert(Job("a")).ok());
  EXPECT_EQ(table.Insert(Job("a")).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(table.Ids(), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(table.Find("a")->version(), 1);
  JobStatus running = *table.Find("a");
  running.set_state(RUNNING);
  ASSERT_TRUE(table.Commit(running, /*durable=*/true).ok());
  EXPECT_EQ(table.Get("a")->version(), 2);
  EXPECT_EQ(*table.State("a"), RUNNING);
  EXPECT_EQ(table.Get("zzz").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Lookup("zzz").status().message(), "no job \"zzz\"");
}

TEST_F(JobTableTest, ProgressOnlyChangesAreWrittenAtMostEveryInterval) {
  JobTable table(Options(), &store_);
  ASSERT_TRUE(table.Insert(Job("j")).ok());
  JobStatus job = *table.Find("j");
  job.set_step(5);
  ASSERT_TRUE(table.Commit(job, /*durable=*/false).ok());
  EXPECT_EQ(Stored("j")->step(), 0);  // Written at Insert, a moment ago.
  EXPECT_EQ(table.Find("j")->step(), 5);
  now_ += absl::Seconds(2);
  job = *table.Find("j");
  job.set_step(6);
  ASSERT_TRUE(table.Commit(job, /*durable=*/false).ok());
  EXPECT_EQ(Stored("j")->step(), 6);
}

TEST_F(JobTableTest, AFailedWriteChangesNothing) {
  JobTable table(Options(), &store_);
  ASSERT_TRUE(table.Insert(Job("j")).ok());
  data_.failing = true;
  JobStatus job = *table.Find("j");
  job.set_state(RUNNING);
  EXPECT_FALSE(table.Commit(job, /*durable=*/true).ok());
  EXPECT_EQ(table.Find("j")->state(), PENDING);
  EXPECT_FALSE(table.Remove("j").ok());
  EXPECT_NE(table.Find("j"), nullptr);
  EXPECT_FALSE(table.Insert(Job("k")).ok());
  EXPECT_EQ(table.Find("k"), nullptr);
}

TEST_F(JobTableTest, AWatcherReturnsOnAChangeOrAtItsDeadline) {
  JobTable table(Options(), &store_);
  ASSERT_TRUE(table.Insert(Job("j")).ok());
  std::thread changer([&] {
    JobStatus job = *table.Find("j");
    job.set_step(1);
    ASSERT_TRUE(table.Commit(job, /*durable=*/true).ok());
  });
  absl::StatusOr<JobStatus> changed = table.Watch("j", 1, now_ + absl::Hours(1));
  changer.join();
  ASSERT_TRUE(changed.ok());
  EXPECT_EQ(changed->version(), 2);
  // The deadline is on the injected clock.
  absl::StatusOr<JobStatus> same = table.Watch("j", 2, now_);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->version(), 2);
}

TEST_F(JobTableTest, RetentionKeepsTheNewestEndedJobs) {
  JobTable::Options options = Options();
  options.retention_count = 1;
  options.retention_age = absl::Hours(1);
  JobTable table(options, &store_);
  for (const char* id : {"old", "new", "running"}) ASSERT_TRUE(table.Insert(Job(id)).ok());
  JobStatus old = *table.Find("old");
  old.set_state(SUCCEEDED);
  old.set_end_time_ms(absl::ToUnixMillis(now_ - absl::Minutes(2)));
  ASSERT_TRUE(table.Commit(old, true).ok());
  JobStatus recent = *table.Find("new");
  recent.set_state(FAILED);
  recent.set_end_time_ms(absl::ToUnixMillis(now_ - absl::Minutes(1)));
  ASSERT_TRUE(table.Commit(recent, true).ok());
  EXPECT_EQ(table.Expired(), (std::vector<std::string>{"old"}));
  now_ += absl::Hours(1);
  EXPECT_EQ(table.Expired(), (std::vector<std::string>{"new", "old"}));  // Newest end first.
  ASSERT_TRUE(table.Remove("old").ok());
  EXPECT_EQ(table.Ids(), (std::vector<std::string>{"new", "running"}));
  EXPECT_EQ(Stored("old"), nullptr);
}

TEST_F(JobTableTest, NewIdsComeFromTheName) {
  JobTable table(Options(), &store_);
  EXPECT_EQ(table.NewId("fashion mnist/mlp"), "fashion-mnist-mlp-1");
  EXPECT_EQ(table.NewId(""), "job-1");
  ASSERT_TRUE(table.Insert(Job("x-1")).ok());
  EXPECT_EQ(table.NewId("x"), "x-2");
}

TEST(JobSummaryTest, LeavesOutWhatGrowsWithTheJob) {
  JobStatus job;
  job.add_data_files("a");
  job.add_events()->set_message("e");
  job.mutable_placement()->add_partitions();
  job.add_workers()->add_data()->set_file("a");
  job.add_evaluations()->set_step(1);
  job.add_evaluations()->set_step(2);
  job.mutable_restore()->set_step(3);
  JobStatus summary = JobSummary(job);
  EXPECT_EQ(summary.data_files_size(), 0);
  EXPECT_EQ(summary.events_size(), 0);
  EXPECT_EQ(summary.placement().partitions_size(), 0);
  EXPECT_EQ(summary.workers(0).data_size(), 0);
  ASSERT_EQ(summary.evaluations_size(), 1);
  EXPECT_EQ(summary.evaluations(0).step(), 2);
  EXPECT_FALSE(summary.has_restore());
}

}  // namespace
}  // namespace control
}  // namespace downpour
