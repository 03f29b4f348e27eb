// //bench:pipeline — throughput of a model split over p GPUs of one worker
// (PipelineModel, model/pipeline.h) against one GPU's on the same model at
// the same micro-batch size.
//
//   bazel build -c opt //bench:pipeline
//   bazel-bin/bench/pipeline [--stages=2,4] [--width=4096] [--layers=32]
//       [--micro_batch=512] [--micro_per_stage=4] [--precision=bf16]
//       [--schedule=1f1b|gpipe] [--steps=10] [--repeats=3] [--warmup=3] [--cpu]
//
// The model: an input layer (--input wide) into --layers dense layers of
// --width with ReLUs, then 16 logits and the loss; the hidden layers split
// evenly over the stages (the input layer, --input/--width of a hidden
// layer's work, with the first, the logits with the last). A step is
// m = micro_per_stage * p micro-batches of --micro_batch examples (so the
// pipeline's bubble allows at most m / (m + p - 1) of p GPUs), parameters
// and gradients stay on the devices (TrainStepOptions params_from_host and
// grads_to_host false), the features (--input floats an example) go up
// from the host each step as the trainer's do. Each figure is the median of
// --repeats timed loops of --steps steps.
//
// Baselines on GPU 0, same run: the same model unsplit (one stage) in the
// same m micro-batches of the same size (gradient accumulation; what p = 1
// of the pipeline is), and a plain Model stepping one micro-batch at a time
// (TrainStepOnDevice; bf16 casts its weights every call there, which the
// one-stage pipeline does once a step). ratio = pipelined examples/s / (p x
// the one-stage examples/s).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "model/devices.h"
#include "model/model.h"
#include "model/pipeline.h"

ABSL_FLAG(std::string, stages, "2,4", "Pipeline sizes to time (GPUs 0..p-1)");
ABSL_FLAG(int32_t, width, 4096, "Units of each hidden dense layer");
ABSL_FLAG(int32_t, layers, 32, "Hidden dense layers (width x width), split evenly");
ABSL_FLAG(int32_t, input, 256, "Features per example");
ABSL_FLAG(int32_t, micro_batch, 512, "Examples per micro-batch");
ABSL_FLAG(int32_t, micro_per_stage, 4, "Micro-batches per step per stage (m = this x p)");
ABSL_FLAG(std::string, precision, "bf16", "fp32, tf32, fp32_strict or bf16");
ABSL_FLAG(std::string, schedule, "1f1b", "1f1b or gpipe");
ABSL_FLAG(int32_t, steps, 10, "Steps per timed loop");
ABSL_FLAG(int32_t, repeats, 3, "Timed loops (the median is reported)");
ABSL_FLAG(int32_t, warmup, 3, "Untimed steps first");
ABSL_FLAG(bool, cpu, false, "Run every stage on the CPU (a smoke test of the benchmark)");

namespace downpour {
namespace {

using Clock = std::chrono::steady_clock;

// The benchmark's model in `stages` stages of m micro-batches.
ModelSpec MakeSpec(int stages, int micro_batches, PipelineSpec::Schedule schedule) {
  const int layers = absl::GetFlag(FLAGS_layers);
  ModelSpec spec;
  spec.add_input_shape(absl::GetFlag(FLAGS_input));
  spec.set_num_classes(16);
  std::vector<std::vector<std::string>> names(stages);
  for (int i = 0; i <= layers; ++i) {
    // Layer 0 is the input layer, 1..layers the hidden ones.
    const int stage = i == 0 ? 0 : std::min(stages - 1, (i - 1) * stages / layers);
    LayerSpec* fc = spec.add_layer();
    fc->set_name(absl::StrCat("fc", i));
    fc->mutable_dense()->set_units(absl::GetFlag(FLAGS_width));
    LayerSpec* relu = spec.add_layer();
    relu->set_name(absl::StrCat("relu", i));
    relu->mutable_relu();
    names[stage].push_back(fc->name());
    names[stage].push_back(relu->name());
  }
  LayerSpec* logits = spec.add_layer();
  logits->set_name("logits");
  logits->mutable_dense()->set_units(16);
  LayerSpec* loss = spec.add_layer();
  loss->set_name("loss");
  loss->mutable_softmax_cross_entropy();
  names.back().push_back("logits");
  names.back().push_back("loss");
  PipelineSpec* pipeline = spec.mutable_pipeline();
  for (const auto& stage : names) {
    PipelineSpec::Stage* s = pipeline->add_stage();
    for (const std::string& name : stage) s->add_layers(name);
  }
  pipeline->set_micro_batches(micro_batches);
  pipeline->set_schedule(schedule);
  return spec;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds per step of `step` (which runs one step and waits).
template <typename Step>
absl::StatusOr<double> TimeSteps(Step&& step) {
  int64_t n = 0;
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) RETURN_IF_ERROR(step(n++));
  std::vector<double> loops;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    const auto began = Clock::now();
    for (int i = 0; i < absl::GetFlag(FLAGS_steps); ++i) RETURN_IF_ERROR(step(n++));
    loops.push_back(std::chrono::duration<double>(Clock::now() - began).count() /
                    absl::GetFlag(FLAGS_steps));
  }
  return Median(loops);
}

struct Data {
  std::vector<float> features;
  std::vector<int32_t> labels;
};

Data RandomData(int64_t batch) {
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal;
  Data d;
  d.features.resize(batch * absl::GetFlag(FLAGS_input));
  for (float& x : d.features) x = normal(rng);
  for (int64_t i = 0; i < batch; ++i) d.labels.push_back(static_cast<int32_t>(rng() % 16));
  return d;
}

// Seconds per step of a pipeline of `stages` over m micro-batches.
absl::StatusOr<double> TimePipeline(int stages, int m, PipelineSpec::Schedule schedule,
                                    const ModelOptions& options, const Data& data) {
  std::vector<int> devices;
  for (int s = 0; s < stages; ++s) devices.push_back(absl::GetFlag(FLAGS_cpu) ? -1 : s);
  ASSIGN_OR_RETURN(std::unique_ptr<PipelineModel> model,
                   PipelineModel::Create(MakeSpec(stages, m, schedule), 1, devices, options));
  const int64_t batch = int64_t{m} * absl::GetFlag(FLAGS_micro_batch);
  TrainStepOptions resident;
  resident.params_from_host = false;
  resident.grads_to_host = false;
  // Parameters go up once; then they stay (a step does not change them:
  // the benchmark times the step, not an optimizer).
  RETURN_IF_ERROR(model->TrainStep(data.features.data(), data.labels.data(), batch, 0).status());
  ASSIGN_OR_RETURN(
      double seconds, TimeSteps([&](int64_t step) -> absl::Status {
        return model->TrainStep(data.features.data(), data.labels.data(), batch, step, resident)
            .status();
      }));
  for (int s = 0; s < stages; ++s) {
    const Model::ComputeMemory memory = model->compute_memory()[s];
    std::printf("    stage %d on %s: %d activation sets, %.0f MiB\n", s,
                model->stage(s)->device_name().c_str(), model->stage(s)->activation_sets(),
                memory.total() / 1048576.0);
  }
  return seconds;
}

// Seconds per micro-batch of a plain Model (TrainStepOnDevice).
absl::StatusOr<double> TimePlainModel(const ModelOptions& options, const Data& data) {
  ModelSpec spec = MakeSpec(1, 1, PipelineSpec::ONE_F_ONE_B);
  spec.clear_pipeline();
  ModelOptions plain = options;
  plain.device = absl::GetFlag(FLAGS_cpu) ? -1 : 0;
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(spec, 1, plain));
  const int64_t b = absl::GetFlag(FLAGS_micro_batch);
  kernels::ComputeBackend& backend = model->backend();
  ASSIGN_OR_RETURN(kernels::DeviceMemory features,
                   backend.Allocate(sizeof(float) * b * model->input_size()));
  ASSIGN_OR_RETURN(kernels::DeviceMemory labels, backend.Allocate(sizeof(int32_t) * b));
  RETURN_IF_ERROR(backend.ToDevice(features.as<void>(), data.features.data(),
                                   sizeof(float) * b * model->input_size()));
  RETURN_IF_ERROR(backend.ToDevice(labels.as<void>(), data.labels.data(), sizeof(int32_t) * b));
  RETURN_IF_ERROR(model->ParamsToDevice());
  return TimeSteps([&](int64_t step) -> absl::Status {
    RETURN_IF_ERROR(model->TrainStepOnDevice(features.as<float>(), labels.as<int32_t>(), b, step));
    return model->LastStepResult().status();
  });
}

int Run() {
  Precision precision = FP32;
  if (!Precision_Parse(absl::AsciiStrToUpper(absl::GetFlag(FLAGS_precision)), &precision)) {
    std::fprintf(stderr, "--precision %s is not a precision\n",
                 absl::GetFlag(FLAGS_precision).c_str());
    return 2;
  }
  const std::string schedule_name = absl::GetFlag(FLAGS_schedule);
  if (schedule_name != "1f1b" && schedule_name != "gpipe") {
    std::fprintf(stderr, "--schedule %s is not 1f1b or gpipe\n", schedule_name.c_str());
    return 2;
  }
  const PipelineSpec::Schedule schedule =
      schedule_name == "gpipe" ? PipelineSpec::GPIPE : PipelineSpec::ONE_F_ONE_B;
  std::vector<int> sizes;
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_stages), ',')) {
    int value = 0;
    if (!absl::SimpleAtoi(p, &value) || value < 1) {
      std::fprintf(stderr, "--stages takes pipeline sizes >= 1, got %s\n",
                   absl::GetFlag(FLAGS_stages).c_str());
      return 2;
    }
    sizes.push_back(value);
  }
  ModelOptions options;
  options.precision = precision;
  const int gpus = absl::GetFlag(FLAGS_cpu) ? 1 << 20 : GpuCount();
  if (gpus == 0) {
    std::fprintf(stderr, "no GPU (%s); --cpu runs the stages on the CPU\n",
                 GpuUnavailableReason().c_str());
    return 1;
  }
  const int64_t b = absl::GetFlag(FLAGS_micro_batch);
  const double hidden_flops = 6.0 * b * absl::GetFlag(FLAGS_width) * absl::GetFlag(FLAGS_width) *
                              absl::GetFlag(FLAGS_layers);
  std::printf("model: %d + %d dense layers of %d (input %d), micro-batch %lld, %s, %s\n", 1,
              absl::GetFlag(FLAGS_layers), absl::GetFlag(FLAGS_width), absl::GetFlag(FLAGS_input),
              static_cast<long long>(b), Precision_Name(precision).c_str(), schedule_name.c_str());
  auto plain = TimePlainModel(options, RandomData(b));
  if (!plain.ok()) {
    std::fprintf(stderr, "plain model: %s\n", std::string(plain.status().message()).c_str());
    return 1;
  }
  std::printf("plain Model, one micro-batch a call: %.3f ms, %.0f examples/s, %.0f TFLOP/s\n",
              1e3 * *plain, b / *plain, hidden_flops / *plain / 1e12);
  std::printf(
      "| p | m | bubble bound m/(m+p-1) | 1 GPU ms/step | p GPUs ms/step | 1 GPU ex/s | "
      "p GPUs ex/s | ratio to p x 1 GPU |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::fflush(stdout);
  int failures = 0;
  for (int p : sizes) {
    if (p > gpus) {
      std::printf("| %d | skipped: %d GPUs visible |\n", p, gpus);
      continue;
    }
    const int m = absl::GetFlag(FLAGS_micro_per_stage) * p;
    const Data data = RandomData(int64_t{m} * b);
    std::printf("  p=%d, m=%d: one stage\n", p, m);
    auto one = TimePipeline(1, m, schedule, options, data);
    std::printf("  p=%d, m=%d: %d stages\n", p, m, p);
    auto split = one.ok() ? TimePipeline(p, m, schedule, options, data) : one;
    if (!split.ok()) {
      std::printf("| %d | %d | failed: %s |\n", p, m,
                  std::string(split.status().message()).c_str());
      ++failures;
      continue;
    }
    const double batch = static_cast<double>(m) * b;
    const double ratio = (batch / *split) / (p * batch / *one);
    std::printf("| %d | %d | %.3f | %.2f | %.2f | %.0f | %.0f | **%.3f** |\n", p, m,
                static_cast<double>(m) / (m + p - 1), 1e3 * *one, 1e3 * *split, batch / *one,
                batch / *split, ratio);
    std::fflush(stdout);
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return downpour::Run();
}
