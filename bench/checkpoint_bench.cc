// Checkpoint cost on one shard, against baselines measured in the same run:
//   * write throughput: a shard's checkpoint file (parameters + Adam's two
//     slots, the ResNet-18 half-model of examples/fashion_mnist_resnet18.pbtxt
//     by default) written as the shard writes it (safetensors, CRC32C,
//     temporary file, fsync, rename, directory fsync) beside the disk's raw
//     sequential rate: the same number of bytes written with write(2) in
//     8 MiB pieces and fsynced, alternated, medians;
//   * step slowdown: SYNC training steps (push the gradient, pull the update)
//     of one worker against a real ParameterStore with the CheckpointWriter
//     thread, without checkpoints and then with one every --every steps: the
//     steps that overlap a checkpoint's write against the median step
//     without (step_slowdown), and the step that captures it (copies the
//     partitions; capture_step_ms).
// Prints one JSON line.
//   bazel run -c opt //bench:checkpoint -- [--param_mb=22] [--dir=DIR]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/file.h"
#include "ps/checkpoint.h"
#include "ps/parameter_store.h"
#include "spec/checkpoint_files.h"
#include "spec/job_validation.h"
#include "spec/shard_map.h"
#include "worker/param_exchange.h"

ABSL_FLAG(std::string, dir, "", "Directory written to (default $TMPDIR or /tmp)");
ABSL_FLAG(int64_t, param_mb, 22, "Parameter megabytes on the shard (the file holds 3x: Adam)");
ABSL_FLAG(int, repeats, 5, "Write measurements of each kind");
ABSL_FLAG(int, steps, 60, "Training steps per phase");
ABSL_FLAG(int, every, 15, "Steps between checkpoints in the second phase");

namespace downpour {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void Die(const absl::Status& status) {
  std::fprintf(stderr, "checkpoint_bench: %s\n", std::string(status.message()).c_str());
  std::exit(1);
}

// The disk's raw sequential write of `bytes`: write(2) and fsync. Seconds.
double RawWrite(const std::string& path, const std::string& bytes) {
  const absl::Time start = absl::Now();
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) Die(ErrnoStatus(errno, "open " + path));
  for (size_t at = 0; at < bytes.size();) {
    const ssize_t n = write(fd, bytes.data() + at, std::min<size_t>(8 << 20, bytes.size() - at));
    if (n < 0) Die(ErrnoStatus(errno, "write " + path));
    at += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) Die(ErrnoStatus(errno, "fsync " + path));
  close(fd);
  return absl::ToDoubleSeconds(absl::Now() - start);
}

JobSpec Spec(int64_t param_mb) {
  JobSpec spec;
  spec.set_name("bench");
  ModelSpec* model = spec.mutable_model();
  model->add_input_shape(1024);
  model->set_num_classes(10);
  model->add_layer()->mutable_dense()->set_units(param_mb * (1 << 20) / 4 / 1024);
  model->add_layer()->mutable_dense()->set_units(10);
  model->add_layer()->mutable_softmax_cross_entropy();
  spec.mutable_dataset()->set_train_files("x");
  spec.mutable_dataset()->set_test_files("x");
  spec.mutable_dataset()->set_batch_size(1);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  spec.mutable_optimizer()->set_learning_rate(1e-3f);
  spec.mutable_consistency()->set_mode(ConsistencySpec::SYNC);
  spec.set_num_workers(1);
  spec.set_num_shards(1);
  spec.set_steps(1 << 30);
  ApplyJobDefaults(&spec);
  return spec;
}

int Main() {
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/downpour-checkpoint-bench");
  }
  if (absl::Status made = MakeDirs(dir); !made.ok()) Die(made);

  // One shard's part of a checkpoint, 4 MB partitions with two slots each.
  const JobSpec spec = Spec(absl::GetFlag(FLAGS_param_mb));
  auto params = ValidateJobSpec(spec);
  if (!params.ok()) Die(params.status());
  auto placed = PlacePartitions(*params, 1, spec.partition_bytes());
  if (!placed.ok()) Die(placed.status());
  ShardSnapshot snapshot;
  snapshot.job_id = "bench";
  snapshot.step = 1;
  snapshot.worker_steps = {1};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (const PartitionPlacement& p : *placed) {
    PartitionSnapshot part;
    part.tensor_id = p.tensor_id();
    part.partition = p.partition();
    part.offset = p.offset();
    part.values.resize(p.num_elements());
    for (float& v : part.values) v = uniform(rng);
    part.slots = {part.values, part.values};
    snapshot.partitions.push_back(std::move(part));
  }
  const std::string ours_path = dir + "/" + ShardFileName(0);
  auto first = WriteShardSnapshot(ours_path, snapshot);
  if (!first.ok()) Die(first.status());
  const std::string raw_bytes(first->bytes, 'x');
  std::vector<double> raw_s, ours_s;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    raw_s.push_back(RawWrite(dir + "/raw.bin", raw_bytes));
    const absl::Time start = absl::Now();
    auto written = WriteShardSnapshot(ours_path, snapshot);
    if (!written.ok()) Die(written.status());
    ours_s.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  unlink((dir + "/raw.bin").c_str());
  const double mb = first->bytes / 1e6;
  const double raw_rate = mb / Median(raw_s), ours_rate = mb / Median(ours_s);
  snapshot = ShardSnapshot();

  // Training steps against a store whose checkpoints the writer writes.
  CheckpointWriter writer(dir + "/root");
  ParameterStore store;
  store.SetCheckpointSink([&writer](ShardSnapshot s) { writer.Write(std::move(s)); });
  if (absl::Status added = store.AddJob("bench", spec, 0, *placed); !added.ok()) Die(added);
  ExchangeOptions options;
  options.job_id = "bench";
  options.worker_id = "bench-worker";
  options.incarnation = 1;
  ParameterExchange exchange(options, *placed, {&store});
  std::vector<std::vector<float>> grads, values;
  std::vector<const float*> grad_ptrs;
  std::vector<float*> value_ptrs;
  for (const ParamInfo& p : *params) {
    grads.emplace_back(p.num_elements, 1e-3f);
    values.emplace_back(p.num_elements);
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    grad_ptrs.push_back(grads[i].data());
    value_ptrs.push_back(values[i].data());
  }
  const auto never = [] { return false; };
  if (absl::Status pulled = exchange.Pull(0, 0, value_ptrs, never); !pulled.ok()) Die(pulled);
  const int steps = absl::GetFlag(FLAGS_steps), every = absl::GetFlag(FLAGS_every);
  std::vector<double> plain, overlapping, capturing;
  int checkpoints = 0;
  int64_t step = 0;
  for (int phase = 0; phase < 2; ++phase) {
    for (int i = 0; i < steps; ++i, ++step) {
      const bool mark = phase == 1 && i % every == every / 2;
      if (mark) {
        exchange.MarkNextPush(step + 1);
        ++checkpoints;
      }
      const absl::Time start = absl::Now();
      absl::Status done = exchange.PushPull(step, grad_ptrs, step + 1, 0, value_ptrs, never);
      if (!done.ok()) Die(done);
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      if (phase == 0) {
        plain.push_back(seconds);
      } else if (mark) {
        capturing.push_back(seconds);
      } else if (!writer.Idle()) {
        overlapping.push_back(seconds);
      }
    }
  }
  writer.Drain();
  double overlap_mean = 0;
  for (double s : overlapping) overlap_mean += s / std::max<size_t>(1, overlapping.size());
  const double baseline = Median(plain);
  std::printf(
      "{\"bench\":\"checkpoint\",\"file_mb\":%.1f,\"raw_write_mb_s\":%.0f,"
      "\"checkpoint_write_mb_s\":%.0f,\"write_ratio\":%.2f,\"step_ms\":%.2f,"
      "\"steps_overlapping_checkpoints\":%zu,\"checkpoints\":%d,"
      "\"overlapping_step_ms\":%.2f,\"step_slowdown\":%.3f,\"capture_step_ms\":%.2f}\n",
      mb, raw_rate, ours_rate, ours_rate / raw_rate, baseline * 1e3, overlapping.size(),
      checkpoints, overlap_mean * 1e3, overlap_mean / baseline - 1, Median(capturing) * 1e3);
  RemoveAll(dir).IgnoreError();
  return 0;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return downpour::Main();
}
