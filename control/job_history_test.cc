#include "control/job_history.h"

#include <thread>

#include "control/memory_job_store.h"
#include "gtest/gtest.h"

namespace downpour {
namespace control {
namespace {

class JobHistoryTest : public ::testing::Test {
 protected:
  JobHistory::Options Options() {
    JobHistory::Options options;
    options.log_lines = 3;
    options.progress_points = 2;
    options.now = [this] { return now_; };
    return options;
  }

  static JobLogLine Line(const std::string& job, const std::string& text) {
    JobLogLine line;
    line.set_job_id(job);
    line.set_source("w0");
    line.set_text(text);
    return line;
  }

  static JobStatus Job(int64_t step, int64_t steps = 1000) {
    JobStatus job;
    job.set_id("j");
    job.mutable_spec()->set_steps(steps);
    job.set_step(step);
    return job;
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  MemoryJobStore::Data data_;
  MemoryJobStore store_{&data_};
};

TEST_F(JobHistoryTest, LinesAreNumberedAndTheNewestAreKept) {
  JobHistory history(Options(), &store_);
  for (int i = 1; i <= 5; ++i) history.AddLine(Line("j", "line " + std::to_string(i)));
  JobLogsResponse all = history.LinesAfter("j", 0);
  ASSERT_EQ(all.lines_size(), 3);
  EXPECT_EQ(all.lines(0).sequence(), 3);
  EXPECT_EQ(all.lines(2).text(), "line 5");
  EXPECT_TRUE(all.truncated());
  JobLogsResponse newer = history.LinesAfter("j", 4);
  ASSERT_EQ(newer.lines_size(), 1);
  EXPECT_FALSE(newer.truncated());
  EXPECT_EQ(history.LinesAfter("other", 0).lines_size(), 0);
}

TEST_F(JobHistoryTest, AnEventGoesIntoTheJobsRecordAndItsLog) {
  JobHistory history(Options(), &store_);
  JobStatus job = Job(0);
  for (int i = 0; i < 205; ++i) history.AddEvent(&job, "event " + std::to_string(i));
  ASSERT_EQ(job.events_size(), 200);
  EXPECT_EQ(job.events(199).message(), "event 204");
  EXPECT_EQ(job.events(199).time_ms(), absl::ToUnixMillis(now_));
  JobLogsResponse logs = history.LinesAfter("j", 0);
  ASSERT_EQ(logs.lines_size(), 3);
  EXPECT_EQ(logs.lines(2).source(), "coordinator");
  EXPECT_EQ(logs.lines(2).text(), "event 204");
}

TEST_F(JobHistoryTest, ProgressIsSampledOnTheInjectedClock) {
  JobHistory history(Options(), &store_);
  history.RecordProgress(Job(10));
  history.RecordProgress(Job(11));  // Same second, small move: not kept.
  now_ += absl::Seconds(1);
  history.RecordProgress(Job(11));
  history.RecordProgress(Job(11));  // Same step: not kept.
  std::vector<ProgressPoint> points = history.Progress("j");
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[1].step(), 11);
  history.RecordProgress(Job(500));  // A tenth of the steps: kept at once.
  points = history.Progress("j");
  ASSERT_EQ(points.size(), 2u);  // The newest two.
  EXPECT_EQ(points[1].step(), 500);
}

TEST_F(JobHistoryTest, FlushWritesWhatWasAddedAndAStoreThatFailsKeepsIt) {
  {
    JobHistory history(Options(), &store_);
    history.AddLine(Line("j", "a"));
    history.RecordProgress(Job(7));
    data_.failing = true;
    EXPECT_FALSE(history.Flush().ok());
    data_.failing = false;
    history.AddLine(Line("j", "b"));
    ASSERT_TRUE(history.Flush().ok());
    ASSERT_TRUE(history.Flush().ok());  // Nothing new: nothing written twice.
  }
  ASSERT_EQ(data_.history.lines.size(), 2u);
  EXPECT_EQ(data_.history.lines[0].text(), "a");
  EXPECT_EQ(data_.history.lines[1].text(), "b");
  // A restarted coordinator's history goes on where it was.
  JobHistory restarted(Options(), &store_);
  ASSERT_TRUE(restarted.Load().ok());
  restarted.AddLine(Line("j", "c"));
  JobLogsResponse logs = restarted.LinesAfter("j", 0);
  ASSERT_EQ(logs.lines_size(), 3);
  EXPECT_EQ(logs.lines(2).sequence(), 3);
  ASSERT_EQ(restarted.Progress("j").size(), 1u);
  EXPECT_EQ(restarted.Progress("j")[0].step(), 7);
}

TEST_F(JobHistoryTest, ARemovedJobsRecordsAreNotWritten) {
  JobHistory history(Options(), &store_);
  history.AddLine(Line("gone", "a"));
  history.AddLine(Line("j", "b"));
  history.Remove("gone");
  ASSERT_TRUE(history.Flush().ok());
  ASSERT_EQ(data_.history.lines.size(), 1u);
  EXPECT_EQ(data_.history.lines[0].job_id(), "j");
  EXPECT_EQ(history.LinesAfter("gone", 0).lines_size(), 0);
}

TEST_F(JobHistoryTest, AFollowerWakesWhenALineComes) {
  JobHistory history(Options(), &store_);
  const int64_t seen = history.version();
  std::thread writer([&] { history.AddLine(Line("j", "late")); });
  history.WaitForChange(seen, absl::Seconds(30));
  writer.join();
  EXPECT_GT(history.version(), seen);
  EXPECT_EQ(history.LinesAfter("j", 0).lines_size(), 1);
}

}  // namespace
}  // namespace control
}  // namespace downpour
