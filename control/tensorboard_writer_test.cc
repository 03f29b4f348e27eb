#include "control/tensorboard_writer.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/file.h"
#include "common/log.h"
#include "control/tensorboard_events.h"
#include "gtest/gtest.h"

namespace downpour {
namespace control {
namespace {

using tensorboard::Event;

class TensorBoardWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TEST_TMPDIR");
    root_ = absl::StrCat(base != nullptr ? base : "/tmp", "/tensorboard_writer_test/",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_TRUE(RemoveAll(root_).ok());
  }

  TensorBoardWriter::Options MakeOptions() {
    TensorBoardWriter::Options options;
    options.root = root_;
    options.hostname = "host-a";
    options.now = [this] { return now_; };
    return options;
  }

  std::vector<std::string> Files(const std::string& job_id) {
    absl::StatusOr<std::vector<std::string>> names = ListDir(absl::StrCat(root_, "/", job_id));
    EXPECT_TRUE(names.ok()) << names.status();
    return names.ok() ? *names : std::vector<std::string>{};
  }

  std::string root_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000) + absl::Milliseconds(250);
};

TEST_F(TensorBoardWriterTest, FileVersionFirstThenEachScalarAtItsStep) {
  TensorBoardWriter writer(MakeOptions());
  writer.AddScalar("mnist-1", "loss", 10, 2.5);
  now_ += absl::Seconds(1);
  writer.AddScalar("mnist-1", "examples_per_second", 10, 1000);
  writer.AddScalar("mnist-1", "test_accuracy", 20, 0.75);

  ASSERT_EQ(Files("mnist-1"), std::vector<std::string>{"events.out.tfevents.1700000000.host-a"});
  // Read while the writer is open: every point is in the file already.
  std::vector<Event> events =
      ReadEvents(absl::StrCat(root_, "/mnist-1/events.out.tfevents.1700000000.host-a"));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_DOUBLE_EQ(events[0].wall_time(), 1700000000.25);
  EXPECT_DOUBLE_EQ(events[2].wall_time(), 1700000001.25);
  std::vector<Point> points = Scalars(events);
  ASSERT_EQ(points.size(), 3u);
  EXPECT_EQ(points[0].tag, "loss");
  EXPECT_EQ(points[0].step, 10);
  EXPECT_FLOAT_EQ(points[0].value, 2.5f);
  EXPECT_EQ(points[1].tag, "examples_per_second");
  EXPECT_FLOAT_EQ(points[1].value, 1000.0f);
  EXPECT_EQ(points[2].tag, "test_accuracy");
  EXPECT_EQ(points[2].step, 20);
  EXPECT_FLOAT_EQ(points[2].value, 0.75f);
}

TEST_F(TensorBoardWriterTest, EachTagsStepsOnlyRise) {
  TensorBoardWriter writer(MakeOptions());
  writer.AddScalar("j", "loss", 5, 1.0);
  writer.AddScalar("j", "loss", 5, 0.9);           // Same step: dropped.
  writer.AddScalar("j", "loss", 3, 0.8);           // Back: dropped.
  writer.AddScalar("j", "test_accuracy", 5, 0.5);  // Another tag: its own steps.
  writer.AddScalar("j", "loss", 6, 0.7);
  std::vector<Point> points = Scalars(ReadEvents(absl::StrCat(root_, "/j/", Files("j").at(0))));
  ASSERT_EQ(points.size(), 3u);
  EXPECT_EQ(points[0].step, 5);
  EXPECT_FLOAT_EQ(points[0].value, 1.0f);
  EXPECT_EQ(points[1].tag, "test_accuracy");
  EXPECT_EQ(points[2].step, 6);
}

TEST_F(TensorBoardWriterTest, JobsHaveTheirOwnDirectories) {
  TensorBoardWriter writer(MakeOptions());
  writer.AddScalar("a", "loss", 1, 1.0);
  writer.AddScalar("b", "loss", 1, 2.0);
  EXPECT_EQ(Files("a").size(), 1u);
  EXPECT_EQ(Files("b").size(), 1u);
  EXPECT_FLOAT_EQ(Scalars(ReadEvents(absl::StrCat(root_, "/b/", Files("b")[0])))[0].value, 2.0f);
}

TEST_F(TensorBoardWriterTest, ARestartAddsANewFileBesideTheOld) {
  {
    TensorBoardWriter writer(MakeOptions());
    writer.AddScalar("j", "loss", 1, 1.0);
  }
  // Restarted within the same second: the old file is not appended to.
  TensorBoardWriter writer(MakeOptions());
  writer.AddScalar("j", "loss", 2, 0.5);
  now_ += absl::Seconds(3);
  writer.CloseJob("j");  // The job ended; run again later.
  writer.AddScalar("j", "loss", 3, 0.25);
  std::vector<std::string> files = Files("j");
  ASSERT_EQ(files, (std::vector<std::string>{"events.out.tfevents.1700000000.host-a",
                                             "events.out.tfevents.1700000000.host-a.1",
                                             "events.out.tfevents.1700000003.host-a"}));
  for (int i = 0; i < 3; ++i) {
    std::vector<Event> events = ReadEvents(absl::StrCat(root_, "/j/", files[i]));
    ASSERT_EQ(events.size(), 2u) << files[i];
    EXPECT_EQ(events[0].file_version(), "brain.Event:2");
    EXPECT_EQ(events[1].step(), i + 1);
  }
}

TEST_F(TensorBoardWriterTest, AFailureIsLoggedOnceAndNeverThrown) {
  // The root is a regular file: no job directory can be made under it.
  ASSERT_TRUE(MakeDirs(root_).ok());
  root_ += "/not-a-directory";
  {
    absl::StatusOr<std::unique_ptr<AtomicFile>> file = AtomicFile::Create(root_, "test file");
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE((*file)->Commit().ok());
  }
  absl::Mutex mu;
  std::vector<std::string> lines;
  SetLogObserver([&](absl::Time, absl::string_view line) {
    absl::MutexLock lock(&mu);
    lines.emplace_back(line);
  });
  TensorBoardWriter writer(MakeOptions());
  for (int step = 1; step <= 5; ++step) writer.AddScalar("j", "loss", step, 1.0);
  writer.AddScalar("j", "test_accuracy", 6, 0.5);
  SetLogObserver(nullptr);
  absl::MutexLock lock(&mu);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(absl::StrContains(lines[0], "job j")) << lines[0];
  EXPECT_TRUE(absl::StrContains(lines[0], "not-a-directory")) << lines[0];
}

TEST_F(TensorBoardWriterTest, AJobIdThatIsNoFileNameIsRefused) {
  TensorBoardWriter writer(MakeOptions());
  writer.AddScalar("..", "loss", 1, 1.0);
  writer.AddScalar("a/b", "loss", 1, 1.0);
  absl::StatusOr<std::vector<std::string>> names = ListDir(root_);
  EXPECT_TRUE(!names.ok() || names->empty());
}

}  // namespace
}  // namespace control
}  // namespace downpour
