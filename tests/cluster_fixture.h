// A test fixture over LocalCluster: Fashion-MNIST imported once per test
// binary, a cluster per test, job specs written into its directory, and a
// teardown that fails the test when a daemon crashed or did not stop
// cleanly.
#ifndef DOWNPOUR_TESTS_CLUSTER_FIXTURE_H_
#define DOWNPOUR_TESTS_CLUSTER_FIXTURE_H_

#include <algorithm>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {

// Whether one of the job's events contains `text`.
inline bool HasEvent(const JobStatus& job, absl::string_view text) {
  return std::any_of(job.events().begin(), job.events().end(),
                     [&](const JobEvent& e) { return absl::StrContains(e.message(), text); });
}

// The job's events, one per line, for failure messages.
inline std::string Events(const JobStatus& job) {
  std::string out;
  for (const JobEvent& e : job.events()) absl::StrAppend(&out, "\n  ", e.message());
  return out;
}

// The first worker rank of the job that is lost (no worker holds it), or -1.
inline int LostRank(const JobStatus& job) {
  for (const WorkerProgress& w : job.workers()) {
    if (w.lost()) return w.rank();
  }
  return -1;
}

class ClusterFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_dir_ = new std::string(MakeTempDir("data"));
    absl::Status imported = ImportFashionMnist(*data_dir_, 12000);
    ASSERT_TRUE(imported.ok()) << imported;
  }

  static void TearDownTestSuite() {
    delete data_dir_;
    data_dir_ = nullptr;
  }

  // Starts a cluster on the imported data (options.data_dir is filled in).
  void StartCluster(LocalCluster::Options options) {
    options.data_dir = *data_dir_;
    cluster_ = std::make_unique<LocalCluster>(options);
    absl::Status started = cluster_->Start();
    ASSERT_TRUE(started.ok()) << started << cluster_->Logs();
  }

  // Polls the job until `done` holds (false after `timeout`).
  bool AwaitJob(const std::string& id, const std::function<bool(const JobStatus&)>& done,
                absl::Duration timeout = absl::Minutes(2)) {
    const absl::Time give_up = absl::Now() + timeout;
    while (absl::Now() < give_up) {
      if (done(cluster_->GetJob(id))) return true;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  }

  // Writes a job spec into the cluster's directory; returns its path.
  std::string WriteSpec(const std::string& text) {
    const std::string path = absl::StrCat(cluster_->dir(), "/spec", ++specs_, ".pbtxt");
    std::ofstream(path) << text;
    return path;
  }

  void TearDown() override {
    if (cluster_) {
      std::vector<std::string> unclean = cluster_->StopAll();
      EXPECT_TRUE(unclean.empty()) << absl::StrJoin(unclean, "; ") << cluster_->Logs();
    }
  }

  static std::string* data_dir_;
  std::unique_ptr<LocalCluster> cluster_;
  int specs_ = 0;
};

inline std::string* ClusterFixture::data_dir_ = nullptr;

}  // namespace testing
}  // namespace downpour

#endif  // DOWNPOUR_TESTS_CLUSTER_FIXTURE_H_
