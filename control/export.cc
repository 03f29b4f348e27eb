#include "control/export.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "google/protobuf/text_format.h"
#include "spec/checkpoint_files.h"
#include "spec/model_shape.h"

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
        std::string suffix = Suffix(p.name);
        if (suffix == "gamma" || suffix == "table") suffix = "weight";
        if (suffix == "beta") suffix = "bias";
        t.name = absl::StrCat(layer.name, ".", suffix);
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

}  // namespace control
}  // namespace downpour
