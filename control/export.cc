#include "control/export.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "control/checkpoints.h"
#include "google/protobuf/text_format.h"
#include "spec/checkpoint_files.h"
#include "spec/model_shape.h"
#include "spec/shard_map.h"

namespace downpour {
namespace control {
namespace {

// The tensors of the file, owned until they are serialised.
struct Tensor {
  std::string name;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<int64_t> shape;
  std::vector<float> values;
  int64_t integer = 0;  // kI64 scalars.
};

// Every parameter whole, joined from the shards' partitions.
absl::StatusOr<std::vector<std::vector<float>>> JoinParameters(const std::string& root,
                                                               const CheckpointRestore& checkpoint,
                                                               const ModelShape& shape) {
  std::vector<std::vector<float>> params(shape.params.size());
  std::vector<int64_t> covered(shape.params.size(), 0);
  for (const ParamInfo& p : shape.params) params[p.id].assign(p.num_elements, 0.f);
  for (const CheckpointFile& file : checkpoint.files()) {
    const std::string path = absl::StrCat(root, "/", checkpoint.dir(), "/", file.name());
    ASSIGN_OR_RETURN(ShardSnapshot snapshot, ReadShardSnapshot(path, file));
    for (const PartitionSnapshot& part : snapshot.partitions) {
      const int64_t n = static_cast<int64_t>(part.values.size());
      if (part.tensor_id < 0 || part.tensor_id >= static_cast<int>(params.size()) ||
          part.offset < 0 || part.offset + n > shape.params[part.tensor_id].num_elements) {
        return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": partition ",
                                                part.tensor_id, "/", part.partition,
                                                " does not fit the job's model"));
      }
      std::copy(part.values.begin(), part.values.end(),
                params[part.tensor_id].begin() + part.offset);
      covered[part.tensor_id] += n;
    }
  }
  for (const ParamInfo& p : shape.params) {
    if (covered[p.id] != p.num_elements) {
      return absl::DataLossError(absl::StrCat("checkpoint ", checkpoint.dir(), " holds ",
                                              covered[p.id], " of the ", p.num_elements,
                                              " elements of ", p.name));
    }
  }
  return params;
}

// "<layer>/weight" -> "weight".
std::string Suffix(const std::string& name) {
  return std::string(name.substr(name.rfind('/') + 1));
}

// The image shape [H, W, C] a dense layer's input was flattened from, or {}.
std::vector<int64_t> FlattenedImage(const ModelShape& shape, const LayerShape& dense) {
  if (dense.inputs.size() != 1 || dense.inputs[0] == LayerShape::kModelInput) return {};
  const LayerShape& flatten = shape.layers[dense.inputs[0]];
  if (flatten.kind != LayerKind::kFlatten || flatten.inputs.size() != 1) return {};
  const std::vector<int64_t>& in = flatten.inputs[0] == LayerShape::kModelInput
                                       ? shape.input_shape
                                       : shape.layers[flatten.inputs[0]].output_shape;
  return in.size() == 3 ? in : std::vector<int64_t>{};
}

// Our dense weight [in, out] as PyTorch's [out, in]; inputs flattened from
// an [H, W, C] image are reordered from (h, w, c) to (c, h, w).
std::vector<float> DenseToPyTorch(const std::vector<float>& w, int64_t in, int64_t out,
                                  const std::vector<int64_t>& image) {
  std::vector<float> t(w.size());
  for (int64_t i = 0; i < in; ++i) {
    int64_t j = i;  // PyTorch's index of our input i.
    if (!image.empty()) {
      const int64_t h = i / (image[1] * image[2]), wi = (i / image[2]) % image[1], c = i % image[2];
      j = (c * image[0] + h) * image[1] + wi;
    }
    for (int64_t o = 0; o < out; ++o) t[o * in + j] = w[i * out + o];
  }
  return t;
}

// PyTorch's [out, in] dense weight as ours, [in, out] (DenseToPyTorch undone).
std::vector<float> DenseFromPyTorch(const float* t, int64_t in, int64_t out,
                                    const std::vector<int64_t>& image) {
  std::vector<float> w(in * out);
  for (int64_t i = 0; i < in; ++i) {
    int64_t j = i;
    if (!image.empty()) {
      const int64_t h = i / (image[1] * image[2]), wi = (i / image[2]) % image[1], c = i % image[2];
      j = (c * image[0] + h) * image[1] + wi;
    }
    for (int64_t o = 0; o < out; ++o) w[i * out + o] = t[o * in + j];
  }
  return w;
}

// [out, in, kh, kw] -> [out, kh, kw, in].
std::vector<float> ConvFromPyTorch(const float* t, const std::vector<int64_t>& s) {
  const int64_t out = s[0], kh = s[1], kw = s[2], in = s[3];
  std::vector<float> w(out * kh * kw * in);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t y = 0; y < kh; ++y) {
      for (int64_t x = 0; x < kw; ++x) {
        for (int64_t i = 0; i < in; ++i) {
          w[((o * kh + y) * kw + x) * in + i] = t[((o * in + i) * kh + y) * kw + x];
        }
      }
    }
  }
  return w;
}

// The name PyTorch gives our tensor `name` ("<layer>/<what>") of `layer`.
std::string PyTorchName(const LayerShape& layer, const std::string& name) {
  std::string suffix = Suffix(name);
  if (suffix == "gamma" || suffix == "table") suffix = "weight";
  if (suffix == "beta") suffix = "bias";
  return absl::StrCat(layer.name, ".", suffix);
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// [out, kh, kw, in] -> [out, in, kh, kw].
std::vector<float> ConvToPyTorch(const std::vector<float>& w, const std::vector<int64_t>& s) {
  const int64_t out = s[0], kh = s[1], kw = s[2], in = s[3];
  std::vector<float> t(w.size());
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t y = 0; y < kh; ++y) {
      for (int64_t x = 0; x < kw; ++x) {
        for (int64_t i = 0; i < in; ++i) {
          t[((o * in + i) * kh + y) * kw + x] = w[((o * kh + y) * kw + x) * in + i];
        }
      }
    }
  }
  return t;
}

}  // namespace

absl::StatusOr<std::string> ExportCheckpoint(const std::string& root, const std::string& job_id,
                                             const JobSpec& spec,
                                             const CheckpointRestore& checkpoint,
                                             ExportLayout layout) {
  ASSIGN_OR_RETURN(ModelShape shape, InferModel(spec.model()));
  ASSIGN_OR_RETURN(std::vector<std::vector<float>> params, JoinParameters(root, checkpoint, shape));
  ASSIGN_OR_RETURN(SafetensorsFile state,
                   SafetensorsFile::Parse(checkpoint.worker_state(),
                                          absl::StrCat(checkpoint.dir(), "/", kWorkerStateName)));
  std::vector<Tensor> tensors;
  for (const LayerShape& layer : shape.layers) {
    for (int32_t id : layer.param_ids) {
      const ParamInfo& p = shape.params[id];
      Tensor t{p.name, TensorDtype::kF32, p.shape, std::move(params[id])};
      if (layout == ExportLayout::kPyTorch) {
        t.name = PyTorchName(layer, p.name);
        if (layer.kind == LayerKind::kDense && p.shape.size() == 2) {
          t.values = DenseToPyTorch(t.values, p.shape[0], p.shape[1], FlattenedImage(shape, layer));
          t.shape = {p.shape[1], p.shape[0]};
        } else if (layer.kind == LayerKind::kConv2d && p.shape.size() == 4) {
          t.values = ConvToPyTorch(t.values, p.shape);
          t.shape = {p.shape[0], p.shape[3], p.shape[1], p.shape[2]};
        }
      }
      tensors.push_back(std::move(t));
    }
    for (int32_t id : layer.local_state_ids) {
      const ParamInfo& s = shape.local_state[id];
      absl::StatusOr<const float*> values = state.Floats(s.name, s.num_elements);
      if (!values.ok()) {
        return absl::DataLossError(
            absl::StrCat("checkpoint ", checkpoint.dir(), ": ", values.status().message()));
      }
      Tensor t{s.name, TensorDtype::kF32, s.shape,
               std::vector<float>(*values, *values + s.num_elements)};
      if (layout == ExportLayout::kPyTorch) t.name = absl::StrCat(layer.name, ".", Suffix(s.name));
      tensors.push_back(std::move(t));
    }
    if (layout == ExportLayout::kPyTorch && layer.kind == LayerKind::kBatchNorm) {
      Tensor tracked{absl::StrCat(layer.name, ".num_batches_tracked"), TensorDtype::kI64, {}, {}};
      tracked.integer = checkpoint.step();
      tensors.push_back(std::move(tracked));
    }
  }

  std::vector<TensorToWrite> out;
  for (const Tensor& t : tensors) {
    out.push_back({t.name, t.dtype, t.shape,
                   t.dtype == TensorDtype::kI64 ? static_cast<const void*>(&t.integer)
                                                : static_cast<const void*>(t.values.data())});
  }
  std::string spec_text;
  google::protobuf::TextFormat::PrintToString(spec, &spec_text);
  return SerializeSafetensors(
      out, {{"format", "pt"},
            {"downpour.job", job_id},
            {"downpour.step", absl::StrCat(checkpoint.step())},
            {"downpour.layout", layout == ExportLayout::kPyTorch ? "pytorch" : "native"},
            {"downpour.spec", spec_text}});
}

absl::StatusOr<CheckpointInfo> WriteInitialCheckpoint(const std::string& root,
                                                      const std::string& job_id,
                                                      const JobSpec& spec,
                                                      const SafetensorsFile& weights,
                                                      int64_t time_ms) {
  ASSIGN_OR_RETURN(ModelShape shape, InferModel(spec.model()));
  // A tensor by our name, or by PyTorch's in its layout (converted).
  auto find = [&](const LayerShape& layer,
                  const ParamInfo& p) -> absl::StatusOr<std::vector<float>> {
    const std::string torch_name = PyTorchName(layer, p.name);
    std::vector<int64_t> torch_shape = p.shape;
    if (layer.kind == LayerKind::kDense && p.shape.size() == 2) {
      torch_shape = {p.shape[1], p.shape[0]};
    } else if (layer.kind == LayerKind::kConv2d && p.shape.size() == 4) {
      torch_shape = {p.shape[0], p.shape[3], p.shape[1], p.shape[2]};
    }
    const bool native = weights.tensors().count(p.name) > 0;
    const std::string& name = native ? p.name : torch_name;
    const std::vector<int64_t>& want = native ? p.shape : torch_shape;
    auto it = weights.tensors().find(name);
    if (it == weights.tensors().end()) {
      return absl::InvalidArgumentError(absl::StrCat("the initial weights have no ", torch_name,
                                                     " (or ", p.name, "), which the model needs"));
    }
    if (it->second.dtype != TensorDtype::kF32 || it->second.shape != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("the initial weights' ", name, " is ", TensorDtypeName(it->second.dtype),
                       " ", ShapeText(it->second.shape), "; the model's is F32 ", ShapeText(want)));
    }
    const float* t = reinterpret_cast<const float*>(it->second.data.data());
    if (native) return std::vector<float>(t, t + p.num_elements);
    if (layer.kind == LayerKind::kDense && p.shape.size() == 2) {
      return DenseFromPyTorch(t, p.shape[0], p.shape[1], FlattenedImage(shape, layer));
    }
    if (layer.kind == LayerKind::kConv2d && p.shape.size() == 4) return ConvFromPyTorch(t, p.shape);
    return std::vector<float>(t, t + p.num_elements);
  };
  std::vector<std::vector<float>> params(shape.params.size()), state(shape.local_state.size());
  for (const LayerShape& layer : shape.layers) {
    for (int32_t id : layer.param_ids) {
      ASSIGN_OR_RETURN(params[id], find(layer, shape.params[id]));
    }
    for (int32_t id : layer.local_state_ids) {
      ASSIGN_OR_RETURN(state[id], find(layer, shape.local_state[id]));
    }
  }

  // The job's partitions, as its shards will hold them.
  ASSIGN_OR_RETURN(std::vector<PartitionPlacement> placed,
                   PlacePartitions(shape.params, spec.num_shards(), spec.partition_bytes()));
  const std::string dir = absl::StrCat(root, "/", CheckpointDir(job_id, 0));
  RETURN_IF_ERROR(MakeDirs(dir));
  CheckpointParts parts;
  for (int shard = 0; shard < spec.num_shards(); ++shard) {
    ShardSnapshot snapshot;
    snapshot.job_id = job_id;
    snapshot.shard = shard;
    snapshot.sync = spec.consistency().mode() == ConsistencySpec::SYNC;
    snapshot.worker_steps.assign(spec.num_workers(), 0);
    for (const PartitionPlacement& p : placed) {
      if (p.shard() != shard) continue;
      PartitionSnapshot part;
      part.tensor_id = p.tensor_id();
      part.partition = p.partition();
      part.offset = p.offset();
      const std::vector<float>& values = params[p.tensor_id()];
      part.values.assign(values.begin() + p.offset(),
                         values.begin() + p.offset() + p.num_elements());
      snapshot.partitions.push_back(std::move(part));
    }
    ASSIGN_OR_RETURN(WrittenFile written,
                     WriteShardSnapshot(absl::StrCat(dir, "/", ShardFileName(shard)), snapshot));
    CheckpointFile file;
    file.set_name(ShardFileName(shard));
    file.set_shard(shard);
    file.set_bytes(written.bytes);
    file.set_crc32c(written.crc32c);
    parts.shard_files.push_back(std::move(file));
  }
  std::vector<TensorToWrite> worker;
  for (const ParamInfo& s : shape.local_state) {
    worker.push_back({s.name, TensorDtype::kF32, s.shape, state[s.id].data()});
  }
  const double keep_loss_scale = 0;  // The worker keeps its initial scale.
  worker.push_back({kLossScaleTensor, TensorDtype::kF64, {}, &keep_loss_scale});
  ASSIGN_OR_RETURN(parts.worker_state, SerializeSafetensors(worker, {}));
  JobStatus job;
  job.set_id(job_id);
  *job.mutable_spec() = spec;
  for (PartitionPlacement& p : placed) *job.mutable_placement()->add_partitions() = std::move(p);
  return CommitCheckpoint(root, job, parts, time_ms);
}

}  // namespace control
}  // namespace downpour
