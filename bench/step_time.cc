// //bench:step_time — one model replica's training step on one device:
// forward + backward + Adam (fused, on the device), data already in device
// memory, nothing copied to the host inside the timed loop. The same models,
// batches and optimizer as bench/pytorch_step_time.py, so the two can run in
// one go on the same card (bench/gpu_session.sh runs both and
// bench/compare_step_time.py prints the ratios).
//
//   bazel build -c opt //bench:step_time
//   bazel-bin/bench/step_time [--models=mlp,cnn,resnet18,vgg11]
//       [--models_dir=bench/models] [--device=0] [--steps=20] [--repeats=5]
//       [--precision=fp32|tf32|fp32_strict|bf16|fp16]
//
// One JSON line per model: step_ms_loop is the median over `repeats` timed
// loops of `steps` steps (device synchronised before and after each loop)
// of the loop's wall time / steps. mem_mb is the device memory the run took
// (cudaMemGetInfo before the model and after the timing). Built without CUDA
// (bench/BUILD.bazel), it runs the CPU kernels only.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/text_format.h"
#include "model/devices.h"
#include "model/model.h"

#ifdef DOWNPOUR_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/conv_plan.h"
#endif

ABSL_FLAG(std::string, models, "mlp,cnn,resnet18,vgg11", "Models (files <name>.pbtxt)");
ABSL_FLAG(std::string, models_dir, "bench/models", "Folder of the ModelSpec text files");
ABSL_FLAG(int32_t, device, 0, "CUDA device, or -1 for the CPU kernels");
ABSL_FLAG(int32_t, steps, 20, "Steps per timed loop");
ABSL_FLAG(int32_t, repeats, 5, "Timed loops (the median is reported)");
ABSL_FLAG(int32_t, warmup, 5, "Untimed steps first (cuDNN algorithm search happens here)");
ABSL_FLAG(bool, log_conv, false, "Print each convolution's measured cuDNN algorithms");
ABSL_FLAG(std::string, conv_layout, "auto",
          "GPU convolution layout: auto (measured per shape), nhwc or nchw");
ABSL_FLAG(bool, conv_graph, true,
          "Let convolutions run through cuDNN's graph API where an engine of it times faster "
          "(false: the legacy cudnnFind algorithms only)");
ABSL_FLAG(bool, profile, false,
          "After the timing, one profiled step: a JSON line per layer (forward/backward ms)");
ABSL_FLAG(std::string, precision, "fp32",
          "Compute precision of dense layers and convolutions (proto/job.proto's Precision): fp32 "
          "(PyTorch's default: convolutions may use TF32 tensor cores, GEMMs full fp32), tf32 "
          "(GEMMs too), fp32_strict (no TF32), bf16 or fp16 (fp32 master weights; fp16 with "
          "dynamic loss scaling, read back every step)");
ABSL_FLAG(int32_t, batch, 0, "Batch for every model (0: each model's own, VGG 64, others 256)");

namespace downpour {
namespace {

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "step_time: %s: %s\n", what.c_str(), std::string(status.message()).c_str());
  return 1;
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The little the benchmark does on the device itself, outside the model.
// Without CUDA, DescribeDevice refuses every device >= 0 first.
#ifdef DOWNPOUR_WITH_CUDA
void SelectDevice(int device, bool log_conv) {
  if (device >= 0) cudaSetDevice(device);
  kernels::cuda::SetConvPlanLogging(log_conv);
}

size_t UsedDeviceBytes(int device) {
  if (device < 0) return 0;
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return total - free;
}

// A device copy of `host` on `device` (the host memory itself for the CPU).
template <typename T>
T* ToDevice(int device, std::vector<T>& host) {
  if (device < 0) return host.data();
  T* copy = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&copy), host.size() * sizeof(T));
  cudaMemcpy(copy, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return copy;
}

void FreeOnDevice(int device, void* copy) {
  if (device >= 0) cudaFree(copy);
}
#else
void SelectDevice(int, bool) {}
size_t UsedDeviceBytes(int) { return 0; }
template <typename T>
T* ToDevice(int, std::vector<T>& host) {
  return host.data();
}
void FreeOnDevice(int, void*) {}
#endif

int Run() {
  const int device = absl::GetFlag(FLAGS_device);
  auto name = DescribeDevice(device);
  if (!name.ok()) return Fail("device", name.status());
  SelectDevice(device, absl::GetFlag(FLAGS_log_conv));
  const std::string layout_name = absl::GetFlag(FLAGS_conv_layout);
  kernels::ConvLayout layout = kernels::ConvLayout::kAuto;
  if (layout_name == "nhwc") {
    layout = kernels::ConvLayout::kNhwc;
  } else if (layout_name == "nchw") {
    layout = kernels::ConvLayout::kNchw;
  } else if (layout_name != "auto") {
    return Fail("--conv_layout", absl::InvalidArgumentError("must be auto, nhwc or nchw"));
  }
  const std::string precision_name = absl::GetFlag(FLAGS_precision);
  // The flag's names are the proto's in lower case, the names
  // bench/pytorch_step_time.py gives its runs (compare_step_time.py pairs by
  // them).
  Precision precision = FP32;
  if (!Precision_Parse(absl::AsciiStrToUpper(precision_name), &precision) ||
      absl::AsciiStrToLower(precision_name) != precision_name) {
    return Fail("--precision",
                absl::InvalidArgumentError("must be fp32, tf32, fp32_strict, bf16 or fp16, got \"" +
                                           precision_name + "\""));
  }
  std::printf("{\"engine\": \"downpour\", \"device\": \"%s\"}\n", name->c_str());
  const std::vector<std::string> names = absl::StrSplit(absl::GetFlag(FLAGS_models), ',');
  for (const std::string& model_name : names) {
    const std::string path = absl::GetFlag(FLAGS_models_dir) + "/" + model_name + ".pbtxt";
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    ModelSpec spec;
    if (!in || !google::protobuf::TextFormat::ParseFromString(text.str(), &spec)) {
      return Fail(path, absl::InvalidArgumentError("cannot read or parse the ModelSpec"));
    }
    int64_t batch = absl::GetFlag(FLAGS_batch);
    if (batch <= 0) batch = model_name == "vgg11" ? 64 : 256;
    const size_t used_before = UsedDeviceBytes(device);
    ModelOptions options;
    options.device = device;
    options.conv_layout = layout;
    options.conv_graph = absl::GetFlag(FLAGS_conv_graph);
    options.precision = precision;
    auto model = Model::Create(spec, /*seed=*/1, options);
    if (!model.ok()) return Fail(model_name, model.status());
    Model& m = **model;

    // A fixed random batch in the compute memory.
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> value(-1.f, 1.f);
    std::vector<float> features(batch * m.input_size());
    for (float& f : features) f = value(gen);
    std::vector<int32_t> labels(batch);
    for (int32_t& l : labels) l = static_cast<int32_t>(gen() % m.num_classes());
    float* features_dev = ToDevice(device, features);
    int32_t* labels_dev = ToDevice(device, labels);

    OptimizerHyperparams hp;
    hp.learning_rate = 1e-3f;
    int64_t step = 0;
    auto one_step = [&]() -> absl::Status {
      absl::Status s = m.TrainStepOnDevice(features_dev, labels_dev, batch, step);
      if (!s.ok()) return s;
      if (precision == FP16) {
        // The skip decision needs the device's non-finite flag (waits).
        absl::StatusOr<StepResult> r = m.LastStepResult();
        if (!r.ok()) return r.status();
      }
      hp.step = ++step;
      return m.ApplyOptimizerOnDevice(OptimizerKind::kAdam, hp);
    };
    for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) {
      absl::Status s = one_step();
      if (!s.ok()) return Fail(model_name, s);
    }
    absl::Status s = m.Synchronize();
    if (!s.ok()) return Fail(model_name, s);
    std::vector<double> loops;
    for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
      const double start = Seconds();
      for (int i = 0; i < absl::GetFlag(FLAGS_steps); ++i) {
        s = one_step();
        if (!s.ok()) return Fail(model_name, s);
      }
      s = m.Synchronize();
      if (!s.ok()) return Fail(model_name, s);
      loops.push_back((Seconds() - start) * 1e3 / absl::GetFlag(FLAGS_steps));
    }
    // The host's share: one step queued onto an idle device (fp16's step
    // waits for its overflow flag, so there it includes the device's time).
    double start = Seconds();
    s = one_step();
    if (!s.ok()) return Fail(model_name, s);
    const double host_ms = (Seconds() - start) * 1e3;
    s = m.Synchronize();
    if (!s.ok()) return Fail(model_name, s);
    auto result = m.LastStepResult();
    if (!result.ok()) return Fail(model_name, result.status());
    const size_t used_after = UsedDeviceBytes(device);
    const Model::ComputeMemory memory = m.compute_memory();
    std::sort(loops.begin(), loops.end());
    std::printf(
        "{\"engine\": \"downpour\", \"model\": \"%s\", \"precision\": \"%s\", \"format\": "
        "\"%s\", \"conv_graph\": %s, \"batch\": %lld, \"step_ms_loop\": %.4f, "
        "\"step_ms_min\": %.4f, "
        "\"host_ms\": %.4f, \"mem_mb\": %.1f, \"compute_mb\": %.1f, \"params_mb\": %.1f, "
        "\"activations_mb\": "
        "%.1f, \"workspace_mb\": %.1f, \"weight_copies_mb\": %.1f, \"final_loss\": %.6g}\n",
        model_name.c_str(), precision_name.c_str(), layout_name.c_str(),
        absl::GetFlag(FLAGS_conv_graph) ? "true" : "false", static_cast<long long>(batch),
        loops[loops.size() / 2], loops[0], host_ms,
        (static_cast<double>(used_after) - static_cast<double>(used_before)) / (1 << 20),
        MiB(memory.total()), MiB(memory.parameters), MiB(memory.activations), MiB(memory.workspace),
        MiB(memory.weight_copies), result->loss);
    std::fflush(stdout);
    if (absl::GetFlag(FLAGS_profile)) {
      auto times = m.ProfileStepOnDevice(features_dev, labels_dev, batch, step);
      if (!times.ok()) return Fail(model_name, times.status());
      LayerTime total;
      total.name = "TOTAL";
      auto print = [&](const LayerTime& t) {
        std::printf(
            "{\"profile\": \"%s\", \"layer\": \"%s\", \"forward_ms\": %.4f, "
            "\"backward_ms\": %.4f, \"host_forward_ms\": %.4f, \"host_backward_ms\": %.4f, "
            "\"forward_scratch_mb\": %.1f, \"backward_scratch_mb\": %.1f}\n",
            model_name.c_str(), t.name.c_str(), t.forward_ms, t.backward_ms, t.host_forward_ms,
            t.host_backward_ms, MiB(t.forward_scratch_bytes), MiB(t.backward_scratch_bytes));
      };
      for (const LayerTime& t : *times) {
        total.forward_ms += t.forward_ms;
        total.backward_ms += t.backward_ms;
        total.host_forward_ms += t.host_forward_ms;
        total.host_backward_ms += t.host_backward_ms;
        total.forward_scratch_bytes =
            std::max(total.forward_scratch_bytes, t.forward_scratch_bytes);
        total.backward_scratch_bytes =
            std::max(total.backward_scratch_bytes, t.backward_scratch_bytes);
        print(t);
      }
      print(total);
      std::fflush(stdout);
    }
    model->reset();
    FreeOnDevice(device, features_dev);
    FreeOnDevice(device, labels_dev);
  }
  return 0;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return downpour::Run();
}
