#include "worker/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "data/ctr_generator.h"
#include "data/example.h"
#include "data/record_io.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "model/devices.h"
#include "ps/parameter_store.h"
#include "spec/job_validation.h"
#include "spec/shard_map.h"

namespace downpour {
namespace {

constexpr int kPixels = 16;
constexpr int kWorkers = 3;
constexpr int kShards = 2;

// Dark images are class 0, bright ones class 1, with some texture.
void WriteDataset(const std::string& path, int examples) {
  auto writer = data::RecordWriter::Open(path);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int i = 0; i < examples; ++i) {
    const int label = i % 2;
    std::vector<uint8_t> pixels(kPixels);
    for (int k = 0; k < kPixels; ++k) {
      pixels[k] = static_cast<uint8_t>((label ? 150 : 20) + (i * 7 + k * 13) % 90);
    }
    ASSERT_TRUE(
        (*writer)->Write(data::EncodeImageExample(pixels.data(), kPixels, label, {kPixels})).ok());
  }
  ASSERT_TRUE((*writer)->Close().ok());
}

// Three layers, split into partitions of 1 KiB over two shards: each step
// is many messages, which the overlapped exchange sends in the order
// backward finishes them and the three workers' arrive in any order.
JobSpec Spec() {
  JobSpec spec;
  spec.set_name("t");
  ModelSpec* model = spec.mutable_model();
  model->add_input_shape(kPixels);
  model->set_num_classes(2);
  model->add_layer()->mutable_dense()->set_units(24);
  model->add_layer()->mutable_relu();
  model->add_layer()->mutable_dense()->set_units(12);
  model->add_layer()->mutable_relu();
  model->add_layer()->mutable_dense()->set_units(2);
  model->add_layer()->mutable_softmax_cross_entropy();
  spec.mutable_dataset()->set_train_files("train-*");
  spec.mutable_dataset()->set_test_files("test-*");
  spec.mutable_dataset()->set_batch_size(8);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  spec.mutable_optimizer()->set_learning_rate(0.01f);
  spec.mutable_consistency()->set_mode(ConsistencySpec::SYNC);
  spec.set_num_workers(kWorkers);
  spec.set_num_shards(kShards);
  spec.set_steps(30);
  spec.set_log_every_steps(10);
  spec.set_partition_bytes(1024);
  spec.set_seed(5);
  ApplyJobDefaults(&spec);
  return spec;
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    data_dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/trainer_test");
    ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", data_dir_).c_str()), 0);
    WriteDataset(data_dir_ + "/train-00000-of-00001", 96);
    WriteDataset(data_dir_ + "/test-00000-of-00001", 32);
  }

  // `spec` (of `workers` workers) on fresh in-process shards.
  void HostJob(int workers, const JobSpec& spec = Spec()) {
    {
      absl::MutexLock lock(&reports_mu_);
      reports_.clear();
    }
    spec_ = spec;
    spec_.set_num_workers(workers);
    auto params = ValidateJobSpec(spec_);
    ASSERT_TRUE(params.ok()) << params.status();
    params_ = *params;
    auto placed = PlacePartitions(params_, kShards, spec_.partition_bytes());
    ASSERT_TRUE(placed.ok()) << placed.status();
    placed_ = *placed;
    stores_.clear();
    shards_.clear();
    for (int s = 0; s < kShards; ++s) {
      stores_.push_back(std::make_unique<ParameterStore>());
      ASSERT_TRUE(stores_.back()->AddJob("j", spec_, s, placed_).ok());
      shards_.push_back(stores_.back().get());
    }
  }

  // Rank `rank`'s task: every `workers`-th record of the one file.
  Task RankTask(int rank, int workers) const {
    Task task;
    task.set_job_id("j");
    *task.mutable_spec() = spec_;
    task.set_rank(rank);
    task.set_steps(spec_.steps());
    task.set_evaluates(rank == 0);  // As the coordinator says while rank 0 is there.
    for (const PartitionPlacement& p : placed_) *task.mutable_placement()->add_partitions() = p;
    DataPart* part = task.add_data();
    part->set_file("train-00000-of-00001");
    part->set_stride(workers);
    part->set_offset(rank);
    return task;
  }

  TrainerOptions Options(int rank, bool overlap) const {
    TrainerOptions options;
    options.node_id = absl::StrCat("w", rank);
    options.incarnation = 1;
    options.data_dir = data_dir_;
    options.exchange.pull_timeout = absl::Seconds(20);
    options.exchange.pull_slice = absl::Milliseconds(200);
    options.exchange.message_bytes = 1024;
    options.exchange.max_inflight = 4;
    options.overlap = overlap;
    options.pull_reduced_weights = pull_reduced_weights_;
    return options;
  }

  // A trainer of `task` on `shards` (empty: the fixture's) whose progress
  // reports Reports() returns.
  std::unique_ptr<JobTrainer> Trainer(Task task, TrainerOptions options,
                                      std::vector<ParameterShard*> shards = {}) {
    return std::make_unique<JobTrainer>(
        std::move(task), std::move(options), shards.empty() ? shards_ : std::move(shards),
        [this](const ReportProgressRequest& r) -> absl::StatusOr<ReportProgressResponse> {
          absl::MutexLock lock(&reports_mu_);
          reports_.push_back(r);
          return ReportProgressResponse();
        });
  }

  // The trainers' progress reports since the last HostJob, in order.
  std::vector<ReportProgressRequest> Reports() {
    absl::MutexLock lock(&reports_mu_);
    return reports_;
  }

  // Every partition's values and versions, as the shards hold them.
  std::string Values(std::vector<int64_t>* versions = nullptr) {
    std::string values;
    for (auto& store : stores_) {
      PullRequest pull;
      pull.set_job_id("j");
      Payload payload;
      absl::StatusOr<PullResponse> pulled =
          store->Pull(pull, absl::Now() + absl::Seconds(10), &payload);
      EXPECT_TRUE(pulled.ok()) << pulled.status();
      if (!pulled.ok()) continue;
      values += payload.ToString();
      for (const PartitionHeader& h : pulled->partitions()) {
        if (versions != nullptr) versions->push_back(h.version());
      }
    }
    return values;
  }

  // Rank 0's worker's dense pushes before it was lost: steps [from, to)
  // whole, then, with `half_step`, step `to`'s last layers only (backward
  // got past them, not the first: messages holding only their partitions
  // went).
  void LoseRankZero(int64_t from, int64_t to, bool half_step) {
    ExchangeOptions options;
    options.job_id = "j";
    options.worker_id = "lost";
    options.incarnation = 1;
    options.message_bytes = 1024;
    options.pull_timeout = absl::Seconds(20);
    ParameterExchange lost(options, placed_, shards_);
    std::vector<std::vector<float>> grads, values;
    std::vector<const float*> g;
    std::vector<float*> v;
    for (const ParamInfo& p : params_) {
      grads.emplace_back(p.num_elements, 0.01f);
      values.emplace_back(p.num_elements);
      g.push_back(grads.back().data());
      v.push_back(values.back().data());
    }
    const auto never = [] { return false; };
    for (int64_t step = from; step < to; ++step) {
      ASSERT_TRUE(lost.PushPull(step, g, step + 1, 0, v, never).ok());
    }
    if (!half_step) return;
    lost.BeginPushPull(to, g, to + 1, 0, v, never);
    for (int id = static_cast<int>(params_.size()) - 1; id >= 2; --id) {
      lost.GradientReady(id, [] { return absl::OkStatus(); });
    }
    ASSERT_TRUE(lost.FinishPushPull(/*abandon=*/true).ok());
  }

  // Trains `spec` with kWorkers trainers on threads (each on `devices`)
  // against in-process shards and returns every partition's final values, as the shards hold
  // them, byte for byte.
  std::string TrainSync(bool overlap, const JobSpec& spec = Spec(),
                        const std::vector<int>& devices = {}) {
    HostJob(kWorkers, spec);
    std::vector<std::unique_ptr<JobTrainer>> trainers;
    for (int rank = 0; rank < kWorkers; ++rank) {
      TrainerOptions options = Options(rank, overlap);
      options.devices = devices;
      trainers.push_back(Trainer(RankTask(rank, kWorkers), std::move(options)));
    }
    std::vector<absl::Status> results(kWorkers);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < kWorkers; ++rank) {
      threads.emplace_back([&, rank] { results[rank] = trainers[rank]->Run(); });
    }
    for (std::thread& t : threads) t.join();
    for (int rank = 0; rank < kWorkers; ++rank) {
      EXPECT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank];
    }
    std::vector<int64_t> versions;
    const std::string values = Values(&versions);
    for (int64_t v : versions) EXPECT_EQ(v, spec_.steps());
    return values;
  }

  // A one-table click model (its table's vocabulary `vocabulary`, an
  // EmbeddingLayer's fields) of `steps` SYNC steps, reading a generated click log.
  JobSpec ClickSpec(absl::string_view vocabulary, int64_t steps) {
    data::CtrDatasetOptions generated;
    generated.out_dir = data_dir_ + "/ctr";
    generated.name = "ctr";
    generated.train_examples = 64;
    generated.test_examples = 16;
    EXPECT_TRUE(data::WriteCtrDataset(generated).ok());
    JobSpec spec;
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
        R"pb(
          name: "ids"
          model {
            num_classes: 2
            inputs { name: "C1" kind: SPARSE }
            layer {
              name: "e"
              inputs: "C1"
              embedding { sparse: true dim: 2 }
            }
            layer { dense { units: 2 } }
            layer { softmax_cross_entropy {} }
          }
          dataset { train_files: "ctr/ctr-train-*" test_files: "ctr/ctr-test-*" batch_size: 8 }
          optimizer { kind: SGD learning_rate: 0.1 }
          consistency { mode: SYNC }
          num_workers: 1
          num_shards: 2
          seed: 1
        )pb",
        &spec));
    EXPECT_TRUE(google::protobuf::TextFormat::MergeFromString(
        std::string(vocabulary), spec.mutable_model()->mutable_layer(0)->mutable_embedding()));
    spec.set_steps(steps);
    ApplyJobDefaults(&spec);
    return spec;
  }

  std::string data_dir_;
  bool pull_reduced_weights_ = true;
  JobSpec spec_;
  std::vector<ParamInfo> params_;
  std::vector<PartitionPlacement> placed_;
  std::vector<std::unique_ptr<ParameterStore>> stores_;
  std::vector<ParameterShard*> shards_;
  absl::Mutex reports_mu_;
  std::vector<ReportProgressRequest> reports_ ABSL_GUARDED_BY(reports_mu_);
};

// The overlapped exchange changes when each partition's gradients reach
// the shards and in which order the workers' arrive, never what a SYNC step
// computes: the shards sum the workers' gradients in rank order, so the
// parameters are the serial path's, bit for bit — one-step-stale
// parameters could never pass as SYNC.
TEST_F(TrainerTest, SyncWithOverlapIsBitIdenticalToTheSerialPath) {
  const std::string serial = TrainSync(/*overlap=*/false);
  ASSERT_FALSE(serial.empty());
  for (int run = 0; run < 3; ++run) {
    const std::string overlapped = TrainSync(/*overlap=*/true);
    ASSERT_EQ(overlapped.size(), serial.size());
    EXPECT_TRUE(overlapped == serial) << "run " << run << " differs from the serial path";
  }
}

// Spec()'s model split into pipeline stages (layer names as InferModel
// gives unnamed layers), `micro` micro-batches a step.
JobSpec PipelineSpec(const std::vector<std::vector<std::string>>& stages, int micro) {
  JobSpec spec = Spec();
  for (const auto& layers : stages) {
    PipelineSpec::Stage* stage = spec.mutable_model()->mutable_pipeline()->add_stage();
    for (const std::string& name : layers) stage->add_layers(name);
  }
  spec.mutable_model()->mutable_pipeline()->set_micro_batches(micro);
  return spec;
}

// A job whose model is split into stages trains through the shards as the
// unsplit model does: the stages run on the CPU (no --devices) and, in one
// micro-batch, push the gradients the whole model would on the same
// batches, so every SYNC step applies the same update and the shards end
// with the unsplit job's parameters — serial or overlapped (each layer's
// forward awaits its parameters from the stages' threads, each gradient
// goes as its stage's backward finishes it).
TEST_F(TrainerTest, APipelineJobPushesTheUnsplitModelsGradients) {
  const std::string unsplit = TrainSync(/*overlap=*/false);
  ASSERT_FALSE(unsplit.empty());
  const JobSpec split =
      PipelineSpec({{"dense0", "relu1"}, {"dense2", "relu3", "dense4", "softmax_cross_entropy5"}},
                   /*micro=*/1);
  for (bool overlap : {false, true}) {
    const std::string trained = TrainSync(overlap, split);
    ASSERT_EQ(trained.size(), unsplit.size());
    EXPECT_TRUE(trained == unsplit) << (overlap ? "overlapped" : "serial");
  }
}

// In several micro-batches (and stages) the step's gradient is the same
// mean, summed in another order: the job trains to the unsplit job's
// parameters within rounding.
TEST_F(TrainerTest, APipelineInMicroBatchesTrainsToTheUnsplitModelsParameters) {
  JobSpec whole = Spec();
  whole.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
  whole.mutable_optimizer()->set_learning_rate(0.05f);
  JobSpec split =
      PipelineSpec({{"dense0"}, {"relu1", "dense2", "relu3"}, {"dense4", "softmax_cross_entropy5"}},
                   /*micro=*/4);
  *split.mutable_optimizer() = whole.optimizer();
  const std::string unsplit = TrainSync(/*overlap=*/true, whole);
  const std::string trained = TrainSync(/*overlap=*/true, split);
  ASSERT_EQ(trained.size(), unsplit.size());
  ASSERT_EQ(trained.size() % sizeof(float), 0u);
  std::vector<float> a(trained.size() / sizeof(float)), b(a.size());
  std::memcpy(a.data(), trained.data(), trained.size());
  std::memcpy(b.data(), unsplit.data(), unsplit.size());
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(double{a[i]} - b[i]));
  EXPECT_LT(diff, 1e-5);
}

// On GPUs (two stages on GPU 0 and 1, or both on GPU 0 where there is one)
// the overlapped exchange queues each partition pulled to its stage's GPU
// and streams each gradient down as its stage's backward finishes it: the
// shards end byte-identical to the serial path's, and within rounding of
// the unsplit model trained on the CPU.
TEST_F(TrainerTest, APipelineOnGpusTrainsAsTheSerialPathAndTheCpu) {
  if (GpuCount() == 0) GTEST_SKIP() << GpuUnavailableReason();
  const std::vector<int> devices =
      GpuCount() >= 2 ? std::vector<int>{0, 1} : std::vector<int>{0, 0};
  JobSpec split =
      PipelineSpec({{"dense0", "relu1"}, {"dense2", "relu3", "dense4", "softmax_cross_entropy5"}},
                   /*micro=*/4);
  split.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
  split.mutable_optimizer()->set_learning_rate(0.05f);
  JobSpec whole = Spec();
  *whole.mutable_optimizer() = split.optimizer();
  const std::string cpu = TrainSync(/*overlap=*/true, whole);
  const std::string serial = TrainSync(/*overlap=*/false, split, devices);
  const std::string overlapped = TrainSync(/*overlap=*/true, split, devices);
  ASSERT_EQ(serial.size(), cpu.size());
  ASSERT_EQ(overlapped.size(), cpu.size());
  EXPECT_TRUE(overlapped == serial);
  std::vector<float> a(cpu.size() / sizeof(float)), b(a.size());
  std::memcpy(a.data(), overlapped.data(), overlapped.size());
  std::memcpy(b.data(), cpu.data(), cpu.size());
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(double{a[i]} - b[i]));
  EXPECT_LT(diff, 1e-4);
}

// A bf16 job on a GPU pulls its dense weights as bf16, as its GPU reads
// them only through their bf16 copies: the shards end byte-identical to the
// same job pulling every parameter as float32, serial and overlapped.
TEST_F(TrainerTest, ABf16JobOnAGpuPullingItsWeightsAsBf16TrainsAsWithFloat32Pulls) {
  if (GpuCount() == 0) GTEST_SKIP() << GpuUnavailableReason();
  JobSpec spec = Spec();
  spec.set_precision(BF16);
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner = ModelRunner::Create(spec, {0});
  ASSERT_TRUE(runner.ok()) << runner.status();
  // The three dense layers' weights (ids 0, 2, 4); their biases stay fp32.
  EXPECT_EQ((*runner)->reduced_weight_params(), (std::vector<int32_t>{0, 2, 4}));
  for (bool overlap : {false, true}) {
    pull_reduced_weights_ = false;
    const std::string full = TrainSync(overlap, spec, {0});
    pull_reduced_weights_ = true;
    const std::string narrowed = TrainSync(overlap, spec, {0});
    ASSERT_FALSE(full.empty());
    ASSERT_EQ(narrowed.size(), full.size());
    EXPECT_TRUE(narrowed == full) << (overlap ? "overlapped" : "serial");
  }
}

// A CPU replica reads every weight in fp32: nothing is pulled narrowed.
TEST_F(TrainerTest, ACpuReplicaPullsEveryParameterAsFloat32) {
  JobSpec spec = Spec();
  spec.set_precision(BF16);
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner = ModelRunner::Create(spec, {});
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_TRUE((*runner)->reduced_weight_params().empty());
}

// A worker whose --devices do not give each stage one fails the job at
// once, permanently (a restart on this worker would not help), in one
// sentence; no GPU is needed to see it, as the devices are counted first.
TEST_F(TrainerTest, APipelineOnTooFewDevicesFailsTheJobNamingBoth) {
  HostJob(1,
          PipelineSpec(
              {{"dense0"}, {"relu1", "dense2"}, {"relu3", "dense4", "softmax_cross_entropy5"}}, 4));
  TrainerOptions options = Options(0, /*overlap=*/true);
  options.devices = {0, 1};
  const absl::Status status = Trainer(RankTask(0, 1), options)->Run();
  EXPECT_EQ(status.message(),
            "the job's pipeline has 3 stages; this worker has 2 devices (--devices)");
  const std::vector<ReportProgressRequest> reports = Reports();
  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports.back().error(), status.message());
  EXPECT_TRUE(reports.back().permanent());
}

// The coordinator names each rank's step target in its task; a task
// without one is refused before anything is built or pulled, permanently
// (the same task would fail a restart alike), in one sentence naming the
// job.
TEST_F(TrainerTest, ATaskWithoutAStepTargetIsRefusedNamingTheJob) {
  HostJob(1);
  Task task = RankTask(0, 1);
  task.clear_steps();
  const absl::Status status = Trainer(task, Options(0, /*overlap=*/true))->Run();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_EQ(status.message(),
            "job j: the task of rank 0 names no step target (Task.steps is 0; a coordinator that "
            "assigns the rank sets it to at least 1)");
  const std::vector<ReportProgressRequest> reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].error(), status.message());
  EXPECT_TRUE(reports[0].permanent());
  std::vector<int64_t> versions;
  Values(&versions);
  for (int64_t version : versions) EXPECT_EQ(version, 0);
}

// A click log whose ids fall outside the sparse table's exact vocabulary
// (the generator's ids span the int64 range; the table takes [0, 10)): the
// job fails at its first step, permanently (the data would fail a restart
// too), naming the table and the id.
TEST_F(TrainerTest, AnIdOutsideASparseTablesVocabularyFailsTheJobPermanently) {
  const JobSpec spec = ClickSpec("vocab_size: 10", /*steps=*/3);
  HostJob(1, spec);
  Task task = RankTask(0, 1);
  task.mutable_data(0)->set_file("ctr/ctr-train-00000-of-00001.tfrecord");
  const absl::Status status = Trainer(task, Options(0, /*overlap=*/true))->Run();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_NE(status.message().find("is outside table e/table (vocab_size 10"), std::string::npos)
      << status;
  const std::vector<ReportProgressRequest> reports = Reports();
  ASSERT_FALSE(reports.empty());
  EXPECT_TRUE(reports.back().permanent());
}

// Bad test data fails the job as bad training data does: permanently (a
// restart would meet it again, three times over, each after training anew),
// in one sentence naming the file — whether the final evaluation or a
// periodic one meets it. A test file cut short mid-record (a copy that
// stopped early) is data loss at the cut record's offset, not a short
// test set; a record that is not the spec's example is refused likewise.
TEST_F(TrainerTest, BadTestDataFailsTheJobPermanentlyNamingTheFile) {
  const std::string test_file = data_dir_ + "/test-00000-of-00001";
  std::string whole;
  {
    std::ifstream in(test_file, std::ios::binary);
    whole.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_GT(whole.size(), 0u);
  const auto write = [&test_file](const std::string& bytes) {
    std::ofstream(test_file, std::ios::binary | std::ios::trunc) << bytes;
  };
  const size_t record_bytes = whole.size() / 32;  // Every record is the same size.
  for (int64_t eval_every : {0, 10}) {
    SCOPED_TRACE(absl::StrCat("eval_every_steps ", eval_every));
    JobSpec spec = Spec();
    spec.set_eval_every_steps(eval_every);

    // Cut in the middle of the last record's payload.
    write(whole.substr(0, whole.size() - record_bytes / 2));
    HostJob(1, spec);
    absl::Status status = Trainer(RankTask(0, 1), Options(0, /*overlap=*/true))->Run();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_THAT(std::string(status.message()),
                ::testing::HasSubstr(absl::StrCat("corrupt record in ", test_file, " at offset ",
                                                  31 * record_bytes, ": truncated payload")));
    std::vector<ReportProgressRequest> reports = Reports();
    ASSERT_FALSE(reports.empty());
    EXPECT_EQ(reports.back().error(), status.message());
    EXPECT_TRUE(reports.back().permanent());
    EXPECT_FALSE(reports.back().diverged());

    // A record that does not decode as the spec's input (9 pixels, not 16).
    {
      const std::vector<uint8_t> pixels(kPixels, 7);
      auto writer = data::RecordWriter::Open(test_file);
      ASSERT_TRUE(writer.ok()) << writer.status();
      ASSERT_TRUE(
          (*writer)->Write(data::EncodeImageExample(pixels.data(), kPixels, 0, {kPixels})).ok());
      ASSERT_TRUE((*writer)->Write(data::EncodeImageExample(pixels.data(), 9, 1, {9})).ok());
      ASSERT_TRUE((*writer)->Close().ok());
    }
    HostJob(1, spec);
    status = Trainer(RankTask(0, 1), Options(0, /*overlap=*/true))->Run();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_THAT(std::string(status.message()),
                ::testing::HasSubstr(absl::StrCat("bad example in ", test_file, " at offset ")));
    reports = Reports();
    ASSERT_FALSE(reports.empty());
    EXPECT_EQ(reports.back().error(), status.message());
    EXPECT_TRUE(reports.back().permanent());
  }
  write(whole);
}

// A shard that refuses every push with `error` and serves the rest from
// `inner` (which it does not own).
class RefusingShard : public ParameterShard {
 public:
  RefusingShard(ParameterShard* inner, absl::Status error)
      : inner_(inner), error_(std::move(error)) {}
  absl::StatusOr<PushResponse> Push(const PushRequest&, const Payload&) override { return error_; }
  absl::StatusOr<PullResponse> Pull(const PullRequest& request, absl::Time deadline,
                                    Payload* payload) override {
    return inner_->Pull(request, deadline, payload);
  }
  absl::StatusOr<PushPullResponse> PushPull(const PushRequest&, const Payload&, const PullRequest&,
                                            absl::Time, Payload*) override {
    return error_;
  }

 private:
  ParameterShard* const inner_;
  const absl::Status error_;
};

// The coordinator hears of a divergence from the mark on the error that
// ended the run (common/status.h), whatever its words: a shard's (which
// found a non-finite gradient), or the worker's own (a non-finite loss).
// Words alone are no divergence.
TEST_F(TrainerTest, ADivergenceIsReportedFromTheErrorsMarkNotItsWords) {
  struct Case {
    absl::Status refusal;  // OK: the shards take every push.
    bool diverged;
  };
  JobSpec exploding = Spec();
  exploding.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
  exploding.mutable_optimizer()->set_learning_rate(1e35f);
  for (const Case& c :
       {Case{MarkDiverged(absl::FailedPreconditionError("partition 0/1 is not finite")), true},
        Case{absl::FailedPreconditionError("training diverged, say these words"), false},
        Case{absl::OkStatus(), true}}) {
    HostJob(1, c.refusal.ok() ? exploding : Spec());
    std::vector<std::unique_ptr<RefusingShard>> refusing;
    std::vector<ParameterShard*> shards = shards_;
    if (!c.refusal.ok()) {
      for (ParameterShard*& shard : shards) {
        refusing.push_back(std::make_unique<RefusingShard>(shard, c.refusal));
        shard = refusing.back().get();
      }
    }
    const absl::Status status =
        Trainer(RankTask(0, 1), Options(0, /*overlap=*/true), shards)->Run();
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(IsDiverged(status), c.diverged) << status;
    const std::vector<ReportProgressRequest> reports = Reports();
    ASSERT_FALSE(reports.empty());
    EXPECT_EQ(reports.back().error(), status.message());
    EXPECT_EQ(reports.back().diverged(), c.diverged) << status;
    if (c.refusal.ok()) {
      EXPECT_NE(status.message().find("training diverged at step "), std::string::npos) << status;
    }
  }
}

// A SYNC worker that died halfway through a pipelined push left its step on
// some partitions only. The worker that takes its rank over starts at the
// step every partition has reached: the partitions that missed the step
// take it from the new worker, the others take its repeat as late, and
// every partition applies every step once — the job ends, at every
// partition's last version, instead of waiting for a step that some
// partitions would never get.
TEST_F(TrainerTest, ARankTakenOverAfterAHalfPushedStepAppliesEveryStepOnce) {
  HostJob(1);
  const int64_t steps = spec_.steps();
  LoseRankZero(0, 5, /*half_step=*/true);
  std::vector<int64_t> versions;
  Values(&versions);
  ASSERT_EQ(*std::min_element(versions.begin(), versions.end()), 5);
  ASSERT_EQ(*std::max_element(versions.begin(), versions.end()), 6);

  Task task = RankTask(0, 1);
  task.mutable_join()->set_step(5);
  std::unique_ptr<JobTrainer> joiner = Trainer(task, Options(0, /*overlap=*/true));
  const absl::Status status = joiner->Run();
  ASSERT_TRUE(status.ok()) << status;
  versions.clear();
  Values(&versions);
  for (int64_t version : versions) EXPECT_EQ(version, steps);
}

// A click-model rank lost after it pushed a step's dense gradients and
// before it pushed the step's rows (they go apart): the partitions are a
// step ahead of the sparse tables, which wait for that step's rows. The rank
// taken over starts at the tables' step (the partitions keep their values of
// before the step), so every step is applied once and the job ends, rather
// than its first pull waiting for rows no one would push.
TEST_F(TrainerTest, ARankLostBetweenAStepsGradientsAndItsRowsGoesOnFromTheTablesStep) {
  const int64_t steps = 12;
  HostJob(1, ClickSpec("vocab_size: 1000 hash_ids: true", steps));
  Task task = RankTask(0, 1);
  task.mutable_data(0)->set_file("ctr/ctr-train-00000-of-00001.tfrecord");
  // The worker lost trained 5 steps, then pushed step 5's gradients alone.
  Task lost = task;
  lost.set_steps(5);
  lost.mutable_spec()->set_steps(5);
  lost.set_evaluates(false);
  const absl::Status trained = Trainer(lost, Options(0, /*overlap=*/true))->Run();
  ASSERT_TRUE(trained.ok()) << trained;
  LoseRankZero(5, 6, /*half_step=*/false);
  // The versions the partitions are at, and those the tables are at.
  auto partitions = [&] {
    std::vector<int64_t> versions;
    Values(&versions);
    return std::set<int64_t>(versions.begin(), versions.end());
  };
  auto tables = [&] {
    std::set<int64_t> versions;
    for (auto& store : stores_) {
      PullRequest pull;
      pull.set_job_id("j");
      pull.add_sparse()->set_table(0);
      Payload payload;
      absl::StatusOr<PullResponse> pulled = store->Pull(pull, absl::Now(), &payload);
      EXPECT_TRUE(pulled.ok()) << pulled.status();
      if (pulled.ok()) versions.insert(pulled->sparse(0).version());
    }
    return versions;
  };
  ASSERT_THAT(partitions(), ::testing::ElementsAre(6));
  ASSERT_THAT(tables(), ::testing::ElementsAre(5));

  task.mutable_join()->set_step(5);
  TrainerOptions options = Options(0, /*overlap=*/true);
  options.node_id = "taker";
  // Long enough for every pull that will be answered.
  options.exchange.pull_timeout = absl::Seconds(5);
  const absl::Status status = Trainer(task, options)->Run();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_THAT(partitions(), ::testing::ElementsAre(steps));
  EXPECT_THAT(tables(), ::testing::ElementsAre(steps));
}

// SYNC with a rank lost halfway through a pushed step: the other rank goes
// on alone once the shards count the lost rank absent, and a worker takes
// the lost rank over later. Every partition stays within a step of the
// others throughout, and the job ends with every partition at its last
// step (what a checkpoint of the job at any step needs).
TEST_F(TrainerTest, PartitionsKeepInStepWhileALostRankIsAbsentAndTakenOver) {
  HostJob(2);
  spec_.set_steps(4000);
  for (auto& store : stores_) store->DropJob("j");
  for (int s = 0; s < kShards; ++s) ASSERT_TRUE(stores_[s]->AddJob("j", spec_, s, placed_).ok());
  const int64_t steps = spec_.steps();
  // Rank 1 trains throughout.
  std::unique_ptr<JobTrainer> rank1 = Trainer(RankTask(1, 2), Options(1, /*overlap=*/true));
  absl::Status rank1_status;
  std::thread rank1_thread([&] { rank1_status = rank1->Run(); });
  LoseRankZero(0, 20, /*half_step=*/true);
  // The coordinator gives the lost rank up: rank 1 goes on alone.
  for (auto& store : stores_) store->SetWorkers("j", {0}, /*rank_nodes=*/{});
  // The shards are read one after another while rank 1 goes on, so one pass
  // can show a spread that never existed (it did under ASan, where a pass is
  // slow). Versions only rise: at the instant between two passes the spread
  // is at least the first pass's highest version minus the second's lowest.
  auto spread = [&] {
    std::vector<int64_t> before;
    std::vector<int64_t> after;
    Values(&before);
    Values(&after);
    return *std::max_element(before.begin(), before.end()) -
           *std::min_element(after.begin(), after.end());
  };
  for (int i = 0; i < 20; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    EXPECT_LE(spread(), 1) << "while rank 0 is absent";  // Not ASSERT: rank1_thread runs.
  }
  // A worker takes rank 0 over.
  Task task = RankTask(0, 2);
  task.mutable_join()->set_step(20);
  std::unique_ptr<JobTrainer> taker = Trainer(task, Options(0, /*overlap=*/true));
  absl::Status taker_status;
  std::thread taker_thread([&] { taker_status = taker->Run(); });
  for (int i = 0; i < 20; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    EXPECT_LE(spread(), 1) << "after the take-over";
  }
  taker_thread.join();
  rank1_thread.join();
  ASSERT_TRUE(taker_status.ok()) << taker_status;
  ASSERT_TRUE(rank1_status.ok()) << rank1_status;
  std::vector<int64_t> versions;
  Values(&versions);
  for (int64_t version : versions) EXPECT_EQ(version, steps);
}

// A record file whose real path is outside the worker's data directories
// fails the job, naming the file, as a permanent error (a restart would not
// help) — whether the worker listed it or the coordinator handed it out;
// the operator's --data_roots allows the directory it leads into.
TEST_F(TrainerTest, ARecordFileLeadingOutsideTheDataDirectoryFailsTheJobNamingIt) {
  const std::string dir = data_dir_ + "/confined";
  const std::string outside = data_dir_ + "/outside";
  ASSERT_EQ(
      std::system(
          absl::StrCat("rm -rf ", dir, " ", outside, " && mkdir -p ", dir, " ", outside).c_str()),
      0);
  WriteDataset(dir + "/test-00000-of-00001", 32);
  WriteDataset(outside + "/secret", 96);
  ASSERT_EQ(symlink((outside + "/secret").c_str(), (dir + "/train-00000-of-00001").c_str()), 0);
  TrainerOptions options = Options(0, /*overlap=*/false);
  options.data_dir = dir;

  HostJob(1);
  Task listed = RankTask(0, 1);  // Lists train-* itself.
  listed.clear_data();
  Task given = RankTask(0, 1);  // Handed train-00000-of-00001.
  for (const Task& task : {listed, given}) {
    HostJob(1);
    const absl::Status status = Trainer(task, options)->Run();
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
    EXPECT_THAT(std::string(status.message()),
                ::testing::StartsWith("record file train-00000-of-00001 leads to "));
    const std::vector<ReportProgressRequest> reports = Reports();
    for (const ReportProgressRequest& r : reports) EXPECT_EQ(r.data_files_size(), 0);
    ASSERT_FALSE(reports.empty());
    EXPECT_EQ(reports.back().error(), status.message());
    EXPECT_TRUE(reports.back().permanent());
  }

  HostJob(1);
  options.data_roots = {outside};
  const absl::Status allowed = Trainer(given, options)->Run();
  EXPECT_TRUE(allowed.ok()) << allowed;
}

}  // namespace
}  // namespace downpour
