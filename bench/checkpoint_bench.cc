// Checkpoint cost on one shard, against baselines measured in the same run:
//   * write throughput: a shard's checkpoint file (parameters + Adam's two
//     slots, the ResNet-18 half-model of examples/fashion_mnist_resnet18.pbtxt
//     by default) written as the shard writes it (safetensors, CRC32C,
//     temporary file, fsync, rename, directory fsync) beside the disk's raw
//     sequential rate: the same number of bytes written with write(2) in
//     8 MiB pieces and fsynced, through the page cache and around it
//     (O_DIRECT), alternated, medians; the raw rate is the better of the two;
//   * step slowdown: SYNC training steps (push the gradient, pull the update)
//     of one worker against a real ParameterStore with the CheckpointWriter
//     thread, in --rounds rounds of steps without checkpoints, then steps
//     with one every --every steps, the writer drained after each round (so
//     drift of the machine falls on both kinds alike): the mean of the steps
//     that overlap a checkpoint's write (the writer busy when the step began
//     or ended) against the median step without (step_slowdown), the
//     median step that captures a checkpoint (capture_step_ms), and per
//     checkpoint the time those steps took beyond the median step
//     (checkpoint_cost_ms: what a checkpoint costs the training in all).
// Prints one JSON line.
//   bazel run -c opt //bench:checkpoint -- [--param_mb=22] [--dir=DIR] [--compute_ms=20]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
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
ABSL_FLAG(int, steps, 60, "Training steps of each kind, without and with checkpoints");
ABSL_FLAG(int, every, 15, "Steps between checkpoints in the steps with checkpoints");
ABSL_FLAG(int, rounds, 2, "Rounds the steps of each kind are split into, alternated");
ABSL_FLAG(int, compute_ms, 0,
          "Milliseconds the worker computes between steps (sleeps; not counted in the steps): "
          "the shard idles then, as it does while workers run forward and backward passes");
ABSL_FLAG(bool, trace, false,
          "Also print each step to stderr: round, with checkpoints (0/1), index, ms, writer "
          "busy before and after (0/1)");

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

// The disk's raw sequential write of `n` bytes at `bytes` (4 KiB-aligned):
// write(2) in 8 MiB pieces and fsync, through the page cache or around it
// (O_DIRECT, whole 4 KiB blocks: up to 4 KiB more). Seconds; 0 when the
// filesystem has no O_DIRECT.
double RawWrite(const std::string& path, const char* bytes, size_t n, bool direct) {
  const absl::Time start = absl::Now();
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
  if (fd < 0 && direct && errno == EINVAL) return 0;
  if (fd < 0) Die(ErrnoStatus(errno, "open " + path));
  if (direct) n = (n + 4095) / 4096 * 4096;
  for (size_t at = 0; at < n;) {
    const ssize_t written = write(fd, bytes + at, std::min<size_t>(8 << 20, n - at));
    if (written < 0) Die(ErrnoStatus(errno, "write " + path));
    at += static_cast<size_t>(written);
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
  // Room for the O_DIRECT write's last whole block.
  const size_t raw_size = (first->bytes + 4095) / 4096 * 4096;
  std::unique_ptr<char, decltype(&std::free)> raw_bytes(
      static_cast<char*>(std::aligned_alloc(4096, raw_size)), &std::free);
  std::memset(raw_bytes.get(), 'x', raw_size);
  std::vector<double> raw_s, raw_direct_s, ours_s;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    raw_s.push_back(RawWrite(dir + "/raw.bin", raw_bytes.get(), first->bytes, false));
    raw_direct_s.push_back(RawWrite(dir + "/raw.bin", raw_bytes.get(), first->bytes, true));
    const absl::Time start = absl::Now();
    auto written = WriteShardSnapshot(ours_path, snapshot);
    if (!written.ok()) Die(written.status());
    ours_s.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  unlink((dir + "/raw.bin").c_str());
  const double mb = first->bytes / 1e6;
  // The disk's rate is the better of the two ways to write it.
  const double raw_cached_rate = mb / Median(raw_s);
  const double raw_direct_rate = Median(raw_direct_s) > 0 ? mb / Median(raw_direct_s) : 0;
  const double raw_rate = std::max(raw_cached_rate, raw_direct_rate);
  const double ours_rate = mb / Median(ours_s);
  snapshot = ShardSnapshot();

  // Training steps against a store whose checkpoints the writer writes.
  CheckpointWriter writer(dir + "/root");
  ParameterStore store;
  store.SetCheckpointSink([&writer](ShardCapture c) { writer.Write(std::move(c)); });
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
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  const bool trace = absl::GetFlag(FLAGS_trace);
  const int compute_ms = absl::GetFlag(FLAGS_compute_ms);
  std::vector<double> plain, overlapping, capturing;
  int checkpoints = 0;
  int64_t step = 0;
  for (int round = 0; round < rounds; ++round) {
    const int per_phase = steps / rounds + (round < steps % rounds ? 1 : 0);
    for (int phase = 0; phase < 2; ++phase) {
      for (int i = 0; i < per_phase; ++i, ++step) {
        const bool mark = phase == 1 && i % every == every / 2;
        if (mark) {
          exchange.MarkNextPush(step + 1);
          ++checkpoints;
        }
        if (compute_ms > 0) absl::SleepFor(absl::Milliseconds(compute_ms));
        const bool busy_before = !writer.Idle();
        const absl::Time start = absl::Now();
        absl::Status done = exchange.PushPull(step, grad_ptrs, step + 1, 0, value_ptrs, never);
        if (!done.ok()) Die(done);
        const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
        if (trace) {
          std::fprintf(stderr, "step %d %d %d %.3f %d %d\n", round, phase, i, seconds * 1e3,
                       busy_before, !writer.Idle());
        }
        if (phase == 0) {
          plain.push_back(seconds);
        } else if (mark) {
          capturing.push_back(seconds);
        } else if (busy_before || !writer.Idle()) {
          overlapping.push_back(seconds);
        }
      }
      // The next steps without checkpoints start with nothing being written.
      writer.Drain();
    }
  }
  double overlap_mean = 0;
  for (double s : overlapping) overlap_mean += s / std::max<size_t>(1, overlapping.size());
  const double baseline = Median(plain);
  // What a checkpoint costs the training in all: the time its capturing
  // step and the steps overlapping its write took beyond the median step.
  double extra = 0;
  for (double s : capturing) extra += s - baseline;
  for (double s : overlapping) extra += s - baseline;
  std::printf(
      "{\"bench\":\"checkpoint\",\"file_mb\":%.1f,\"raw_write_mb_s\":%.0f,"
      "\"raw_cached_mb_s\":%.0f,\"raw_direct_mb_s\":%.0f,"
      "\"checkpoint_write_mb_s\":%.0f,\"write_ratio\":%.2f,\"step_ms\":%.2f,"
      "\"steps_overlapping_checkpoints\":%zu,\"checkpoints\":%d,"
      "\"overlapping_step_ms\":%.2f,\"step_slowdown\":%.3f,\"capture_step_ms\":%.2f,"
      "\"checkpoint_cost_ms\":%.1f}\n",
      mb, raw_rate, raw_cached_rate, raw_direct_rate, ours_rate, ours_rate / raw_rate,
      baseline * 1e3, overlapping.size(), checkpoints, overlap_mean * 1e3,
      overlap_mean / baseline - 1, Median(capturing) * 1e3, extra / std::max(1, checkpoints) * 1e3);
  RemoveAll(dir).IgnoreError();
  return 0;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return downpour::Main();
}
