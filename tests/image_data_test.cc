// Trains through the real daemons on the records TensorFlow wrote
// (data/testdata): GZIP-compressed tf.Examples holding PNG and JPEG images,
// decoded by the workers, with random crop and flip on; and a truncated gzip
// file fails the job with one message naming it.
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "tests/local_cluster.h"

namespace downpour {
namespace testing {
namespace {

// Copies the reference records into a fresh data directory.
std::string CopyTestData() {
  const std::string dir = MakeTempDir("images");
  for (const char* name : {"rgb_png.tfrecord.gz", "rgb_jpeg.tfrecord.gz", "gray_mixed.tfrecord"}) {
    const std::string bytes = ReadFile(Runfile(absl::StrCat("data/testdata/", name)));
    EXPECT_FALSE(bytes.empty()) << name;
    std::ofstream(absl::StrCat(dir, "/", name), std::ios::binary) << bytes;
  }
  return dir;
}

// 8x8 RGB images labelled bright (1) or dark (0).
std::string ImageSpec(const std::string& train_files, int64_t steps) {
  return absl::StrCat(R"(
name: "images"
model {
  input_shape: [8, 8, 3]
  num_classes: 2
  layer { flatten {} }
  layer { dense { units: 16 } }
  layer { relu {} }
  layer { dense { units: 2 } }
  layer { softmax_cross_entropy {} }
}
dataset {
  train_files: ")",
                      train_files, R"("
  test_files: "rgb_png.tfrecord.gz"
  feature_key: "image/encoded"
  label_key: "image/class/label"
  batch_size: 8
  shuffle_buffer: 16
  compression: GZIP
  encoding: ENCODED
  random_crop { padding: 2 }
  random_flip_left_right: true
}
optimizer { kind: ADAM learning_rate: 0.01 }
num_workers: 1
num_shards: 1
steps: )",
                      steps, "\nlog_every_steps: 5\nseed: 3\n");
}

class ImageDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalCluster::Options options;
    options.shards = 1;
    options.workers = 1;
    options.data_dir = CopyTestData();
    data_dir_ = options.data_dir;
    cluster_ = std::make_unique<LocalCluster>(options);
    absl::Status started = cluster_->Start();
    ASSERT_TRUE(started.ok()) << started << cluster_->Logs();
  }

  void TearDown() override {
    if (cluster_ == nullptr) return;
    const std::vector<std::string> unclean = cluster_->StopAll();
    EXPECT_TRUE(unclean.empty()) << unclean.front() << cluster_->Logs();
  }

  CommandResult Submit(const std::string& spec, const std::string& id) {
    const std::string path = absl::StrCat(cluster_->dir(), "/", id, ".pbtxt");
    std::ofstream(path) << spec;
    return cluster_->Ctl({"submit", path, "--job_id=" + id, "--wait"});
  }

  std::string data_dir_;
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(ImageDataTest, TrainsOnGzipPngAndJpegRecordsWithCropAndFlip) {
  CommandResult result = Submit(ImageSpec("rgb_*.tfrecord.gz", 40), "images");
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err << cluster_->Logs();
  const JobStatus job = cluster_->GetJob("images");
  EXPECT_EQ(job.state(), SUCCEEDED) << job.message();
  EXPECT_EQ(job.step(), 40);
  // The test set (8 PNG images, unaugmented) was decoded and evaluated.
  EXPECT_GE(job.test_accuracy(), 0.0);
  EXPECT_LE(job.test_accuracy(), 1.0);
}

TEST_F(ImageDataTest, TruncatedGzipFileFailsTheJobNamingIt) {
  const std::string bytes = ReadFile(data_dir_ + "/rgb_jpeg.tfrecord.gz");
  ASSERT_GT(bytes.size(), 100u);
  std::ofstream(data_dir_ + "/cut.tfrecord.gz", std::ios::binary)
      << bytes.substr(0, bytes.size() - 20);
  CommandResult result = Submit(ImageSpec("cut.tfrecord.gz", 40), "cut");
  EXPECT_NE(result.exit_code, 0);
  const JobStatus job = cluster_->GetJob("cut");
  EXPECT_EQ(job.state(), FAILED);
  EXPECT_NE(job.message().find("cut.tfrecord.gz"), std::string::npos) << job.message();
  EXPECT_NE(job.message().find("gzip"), std::string::npos) << job.message();
}

TEST_F(ImageDataTest, UncompressedFileUnderCompressionGzipFailsTheJobNamingIt) {
  CommandResult result = Submit(ImageSpec("gray_mixed.tfrecord", 40), "not-gzip");
  EXPECT_NE(result.exit_code, 0);
  const JobStatus job = cluster_->GetJob("not-gzip");
  EXPECT_EQ(job.state(), FAILED);
  EXPECT_NE(job.message().find("gray_mixed.tfrecord is not GZIP-compressed"), std::string::npos)
      << job.message();
}

}  // namespace
}  // namespace testing
}  // namespace downpour
