#include "control/export.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <utility>
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
#include "spec/sparse_ids.h"

namespace downpour {
namespace control {
namespace {

// The tensors of the file, owned until they are serialised.
struct Tensor {
  std::string name;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<int64_t> shape;
  std::vector<float> values;
  int64_t integer = 0;            // kI64 scalars.
  std::vector<int64_t> integers;  // Other kI64 tensors.
};

// A sparse table's rows from every shard, ids ascending: row k of `rows`
// ([ids, dim]) is id ids[k].
struct JoinedTable {
  std::vector<int64_t> ids;
  std::vector<float> rows;
};

// What the shards' files hold: every parameter whole, joined from the
// shards' partitions, and every sparse table's rows (in the model's table
// order; none from files written before checkpoints held them).
struct Joined {
  std::vector<std::vector<float>> params;
  std::vector<JoinedTable> tables;
};

// Adds `saved`, shard file `path`'s rows of a table of `shape`, to
// `parts` (per table, each row's id and values).
absl::Status AddRows(const std::string& path, const ModelShape& shape,
                     const SparseTableSnapshot& saved,
                     std::vector<std::vector<std::pair<int64_t, const float*>>>* parts) {
  for (size_t t = 0; t < shape.sparse_tables.size(); ++t) {
    const SparseTableInfo& info = shape.sparse_tables[t];
    if (info.name != saved.name) continue;
    if (saved.dim != info.dim) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": sparse table ",
                                              saved.name, " has rows of dim ", saved.dim,
                                              ", the job's ", info.dim));
    }
    for (size_t k = 0; k < saved.ids.size(); ++k) {
      (*parts)[t].emplace_back(saved.ids[k], saved.values.data() + k * saved.dim);
    }
    return absl::OkStatus();
  }
  return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": sparse table ", saved.name,
                                          " is not one of the job's model"));
}

absl::StatusOr<Joined> JoinShards(const std::string& root, const CheckpointRestore& checkpoint,
                                  const ModelShape& shape) {
  Joined joined;
  std::vector<std::vector<float>>& params = joined.params;
  params.resize(shape.params.size());
  std::vector<int64_t> covered(shape.params.size(), 0);
  for (const ParamInfo& p : shape.params) params[p.id].assign(p.num_elements, 0.f);
  // The snapshots stay until their rows are joined.
  std::vector<ShardSnapshot> snapshots;
  std::vector<std::vector<std::pair<int64_t, const float*>>> parts(shape.sparse_tables.size());
  snapshots.reserve(checkpoint.files_size());
  for (const CheckpointFile& file : checkpoint.files()) {
    const std::string path = absl::StrCat(root, "/", checkpoint.dir(), "/", file.name());
    ASSIGN_OR_RETURN(ShardSnapshot read, ReadShardSnapshot(path, file));
    snapshots.push_back(std::move(read));
    ShardSnapshot& snapshot = snapshots.back();
    for (SparseTableSnapshot& saved : snapshot.sparse_tables) {
      RETURN_IF_ERROR(AddRows(path, shape, saved, &parts));
      std::vector<float>().swap(saved.slot_values);  // Not exported.
    }
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
    snapshot.partitions.clear();
  }
  for (const ParamInfo& p : shape.params) {
    if (covered[p.id] != p.num_elements) {
      return absl::DataLossError(absl::StrCat("checkpoint ", checkpoint.dir(), " holds ",
                                              covered[p.id], " of the ", p.num_elements,
                                              " elements of ", p.name));
    }
  }
  for (size_t t = 0; t < parts.size(); ++t) {
    std::vector<std::pair<int64_t, const float*>>& rows = parts[t];
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    const int64_t dim = shape.sparse_tables[t].dim;
    JoinedTable table;
    table.ids.reserve(rows.size());
    table.rows.reserve(rows.size() * dim);
    for (size_t k = 0; k < rows.size(); ++k) {
      if (k > 0 && rows[k].first == rows[k - 1].first) {
        return absl::DataLossError(absl::StrCat(
            "checkpoint ", checkpoint.dir(), ": row ", rows[k].first, " of sparse table ",
            shape.sparse_tables[t].name, " is in two shards' files"));
      }
      table.ids.push_back(rows[k].first);
      table.rows.insert(table.rows.end(), rows[k].second, rows[k].second + dim);
    }
    joined.tables.push_back(std::move(table));
  }
  return joined;
}

// The sparse table of layer `layer`, or -1.
int SparseTableOf(const ModelShape& shape, int layer) {
  for (size_t t = 0; t < shape.sparse_tables.size(); ++t) {
    if (shape.sparse_tables[t].layer == layer) return static_cast<int>(t);
  }
  return -1;
}

// The names of a sparse table's two tensors: its rows' ids, and the rows.
std::string SparseIdsName(const LayerShape& layer, ExportLayout layout) {
  return absl::StrCat(layer.name, layout == ExportLayout::kPyTorch ? ".ids" : "/ids");
}
std::string SparseRowsName(const LayerShape& layer, ExportLayout layout) {
  return absl::StrCat(layer.name, layout == ExportLayout::kPyTorch ? ".weight" : "/table");
}

// "<layer>/weight" -> "weight".
std::string Suffix(const std::string& name) {
  return std::string(name.substr(name.rfind('/') + 1));
}

// A parameter PyTorch holds in another order than ours: its shape, and
// where element k of ours sits in it (`index` empty: the same order).
struct PyTorchLayout {
  std::vector<int64_t> shape;
  std::function<int64_t(int64_t)> index;
};

// Dense weights: ours [in, out], PyTorch's [out, in], with inputs flattened
// from an [H, W, C] image reordered from (h, w, c) to (c, h, w). Conv
// weights: ours [out, kh, kw, in], PyTorch's [out, in, kh, kw].
PyTorchLayout PyTorchLayoutOf(const ModelShape& shape, const LayerShape& layer,
                              const ParamInfo& p) {
  const std::vector<int64_t>& s = p.shape;
  if (layer.kind == LayerKind::kDense && s.size() == 2) {
    const int64_t in = s[0], out = s[1];
    const std::vector<int64_t> image = FlattenedImage(shape, layer);
    return {{out, in}, [in, out, image](int64_t k) {
              const int64_t i = k / out, o = k % out;
              int64_t j = i;  // PyTorch's index of our input i.
              if (!image.empty()) {
                const int64_t h = i / (image[1] * image[2]), w = (i / image[2]) % image[1],
                              c = i % image[2];
                j = (c * image[0] + h) * image[1] + w;
              }
              return o * in + j;
            }};
  }
  if (layer.kind == LayerKind::kConv2d && s.size() == 4) {
    const int64_t kh = s[1], kw = s[2], in = s[3];
    return {{s[0], in, kh, kw}, [kh, kw, in](int64_t k) {
              const int64_t i = k % in, x = (k / in) % kw, y = (k / (in * kw)) % kh,
                            o = k / (in * kw * kh);
              return ((o * in + i) * kh + y) * kw + x;
            }};
  }
  return {s, nullptr};
}

// The name PyTorch gives our tensor `name` ("<layer>/<what>") of `layer`.
std::string PyTorchName(const LayerShape& layer, const std::string& name) {
  std::string suffix = Suffix(name);
  if (suffix == "gamma" || suffix == "table") suffix = "weight";
  if (suffix == "beta") suffix = "bias";
  return absl::StrCat(layer.name, ".", suffix);
}

// The rows `weights` holds of sparse table `info` (of `layer`), by our names
// or PyTorch's (see the header), sorted by id; none when it has neither.
absl::StatusOr<JoinedTable> InitialRows(const SafetensorsFile& weights, const LayerShape& layer,
                                        const SparseTableInfo& info) {
  JoinedTable table;
  for (ExportLayout layout : {ExportLayout::kNative, ExportLayout::kPyTorch}) {
    const std::string ids_name = SparseIdsName(layer, layout);
    const std::string rows_name = SparseRowsName(layer, layout);
    auto ids = weights.tensors().find(ids_name);
    auto rows = weights.tensors().find(rows_name);
    if (ids == weights.tensors().end() && rows == weights.tensors().end()) continue;
    if (ids == weights.tensors().end() || rows == weights.tensors().end()) {
      const std::string& has = ids == weights.tensors().end() ? rows_name : ids_name;
      const std::string& lacks = ids == weights.tensors().end() ? ids_name : rows_name;
      return absl::InvalidArgumentError(absl::StrCat("the initial weights have ", has, " but no ",
                                                     lacks, " (sparse table ", info.name,
                                                     " needs both)"));
    }
    const int64_t n = ids->second.shape.size() == 1 ? ids->second.shape[0] : -1;
    if (ids->second.dtype != TensorDtype::kI64 || n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the initial weights' ", ids_name, " is ", TensorDtypeName(ids->second.dtype), " ",
          ShapeString(ids->second.shape), "; sparse table ", info.name, "'s ids are I64 [rows]"));
    }
    if (rows->second.dtype != TensorDtype::kF32 ||
        rows->second.shape != std::vector<int64_t>{n, info.dim}) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the initial weights' ", rows_name, " is ", TensorDtypeName(rows->second.dtype), " ",
          ShapeString(rows->second.shape), "; the model's is F32 ", ShapeString({n, info.dim})));
    }
    std::vector<int64_t> given(n);
    std::memcpy(given.data(), ids->second.data.data(), n * sizeof(int64_t));
    std::vector<float> values(n * info.dim);
    std::memcpy(values.data(), rows->second.data.data(), values.size() * sizeof(float));
    std::vector<int64_t> order(n);
    for (int64_t k = 0; k < n; ++k) order[k] = k;
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return given[a] < given[b]; });
    for (int64_t k = 0; k < n; ++k) {
      const int64_t id = given[order[k]];
      if (id < 0 || id >= info.vocab_size || (k > 0 && id == table.ids.back())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the initial weights' ", ids_name, " holds id ", id,
            id < 0 || id >= info.vocab_size ? absl::StrCat(", outside sparse table ", info.name,
                                                           "'s vocabulary of ", info.vocab_size)
                                            : " twice"));
      }
      table.ids.push_back(id);
      const float* row = values.data() + order[k] * info.dim;
      table.rows.insert(table.rows.end(), row, row + info.dim);
    }
    return table;
  }
  return table;
}

}  // namespace

absl::StatusOr<std::string> ExportCheckpoint(const std::string& root, const std::string& job_id,
                                             const JobSpec& spec,
                                             const CheckpointRestore& checkpoint,
                                             ExportLayout layout,
                                             const std::map<std::string, std::string>& extra) {
  ASSIGN_OR_RETURN(ModelShape shape, InferModel(spec.model()));
  ASSIGN_OR_RETURN(Joined joined, JoinShards(root, checkpoint, shape));
  std::vector<std::vector<float>>& params = joined.params;
  ASSIGN_OR_RETURN(SafetensorsFile state,
                   SafetensorsFile::Parse(checkpoint.worker_state(),
                                          absl::StrCat(checkpoint.dir(), "/", kWorkerStateName)));
  std::vector<Tensor> tensors;
  for (size_t l = 0; l < shape.layers.size(); ++l) {
    const LayerShape& layer = shape.layers[l];
    if (const int t = SparseTableOf(shape, static_cast<int>(l)); t >= 0) {
      JoinedTable& table = joined.tables[t];
      const int64_t rows = static_cast<int64_t>(table.ids.size());
      Tensor ids{SparseIdsName(layer, layout), TensorDtype::kI64, {rows}};
      ids.integers = std::move(table.ids);
      tensors.push_back(std::move(ids));
      tensors.push_back({SparseRowsName(layer, layout),
                         TensorDtype::kF32,
                         {rows, shape.sparse_tables[t].dim},
                         std::move(table.rows)});
    }
    for (int32_t id : layer.param_ids) {
      const ParamInfo& p = shape.params[id];
      Tensor t{p.name, TensorDtype::kF32, p.shape, std::move(params[id])};
      if (layout == ExportLayout::kPyTorch) {
        t.name = PyTorchName(layer, p.name);
        PyTorchLayout torch = PyTorchLayoutOf(shape, layer, p);
        if (torch.index) {
          std::vector<float> ordered(t.values.size());
          for (size_t k = 0; k < ordered.size(); ++k) ordered[torch.index(k)] = t.values[k];
          t.values = std::move(ordered);
        }
        t.shape = std::move(torch.shape);
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
    const void* data = t.values.data();
    if (t.dtype == TensorDtype::kI64) {
      data = t.shape.empty() ? static_cast<const void*>(&t.integer) : t.integers.data();
    }
    out.push_back({t.name, t.dtype, t.shape, data});
  }
  std::string spec_text;
  google::protobuf::TextFormat::PrintToString(spec, &spec_text);
  std::map<std::string, std::string> metadata = extra;
  metadata["format"] = "pt";
  metadata["downpour.job"] = job_id;
  metadata["downpour.step"] = absl::StrCat(checkpoint.step());
  metadata["downpour.layout"] = layout == ExportLayout::kPyTorch ? "pytorch" : "native";
  metadata["downpour.spec"] = spec_text;
  return SerializeSafetensors(out, metadata);
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
    const PyTorchLayout torch = PyTorchLayoutOf(shape, layer, p);
    const bool native = weights.tensors().count(p.name) > 0;
    const std::string& name = native ? p.name : torch_name;
    const std::vector<int64_t>& want = native ? p.shape : torch.shape;
    auto it = weights.tensors().find(name);
    if (it == weights.tensors().end()) {
      return absl::InvalidArgumentError(absl::StrCat("the initial weights have no ", torch_name,
                                                     " (or ", p.name, "), which the model needs"));
    }
    if (it->second.dtype != TensorDtype::kF32 || it->second.shape != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the initial weights' ", name, " is ", TensorDtypeName(it->second.dtype), " ",
          ShapeString(it->second.shape), "; the model's is F32 ", ShapeString(want)));
    }
    const float* t = reinterpret_cast<const float*>(it->second.data.data());
    std::vector<float> values(t, t + p.num_elements);
    if (!native && torch.index) {
      for (int64_t k = 0; k < p.num_elements; ++k) values[k] = t[torch.index(k)];
    }
    return values;
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
  std::vector<JoinedTable> tables;
  for (const SparseTableInfo& info : shape.sparse_tables) {
    ASSIGN_OR_RETURN(JoinedTable table, InitialRows(weights, shape.layers[info.layer], info));
    tables.push_back(std::move(table));
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
    // Each sparse table's rows this shard holds, without optimizer state.
    snapshot.has_sparse = !shape.sparse_tables.empty();
    for (size_t t = 0; t < tables.size(); ++t) {
      const int64_t dim = shape.sparse_tables[t].dim;
      SparseTableSnapshot rows;
      rows.name = shape.sparse_tables[t].name;
      rows.dim = dim;
      for (size_t k = 0; k < tables[t].ids.size(); ++k) {
        const int64_t id = tables[t].ids[k];
        if (SparseShardOf(id, spec.num_shards()) != shard) continue;
        rows.ids.push_back(id);
        rows.values.insert(rows.values.end(), tables[t].rows.begin() + k * dim,
                           tables[t].rows.begin() + (k + 1) * dim);
      }
      rows.updates.assign(rows.ids.size(), 0);
      rows.touches.assign(rows.ids.size(), 1);
      snapshot.sparse_tables.push_back(std::move(rows));
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
