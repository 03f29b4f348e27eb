#include "spec/job_validation.h"

#include <algorithm>
#include <cctype>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spec/limits.h"
#include "spec/model_shape.h"
#include "spec/shard_map.h"

namespace downpour {
namespace {

constexpr int64_t kMaxBatchBytes = int64_t{1} << 30;
constexpr int64_t kMaxModelBytes = int64_t{32} << 30;

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

// The sizes of spec/limits.h, checked before anything reads the spec's
// lists; the total last, so a single long field is named as itself.
absl::Status CheckSizes(const JobSpec& spec) {
  RETURN_IF_ERROR(CheckBytes("name", spec.name(), kMaxNameBytes));
  if (spec.num_workers() > kMaxWorkers) {
    return Bad("num_workers",
               absl::StrCat("is ", spec.num_workers(), "; the limit is ", kMaxWorkers));
  }
  if (spec.num_shards() > kMaxShards) {
    return Bad("num_shards", absl::StrCat("is ", spec.num_shards(), "; the limit is ", kMaxShards));
  }
  if (spec.checkpoint().keep() > kMaxCheckpointsKept) {
    return Bad("checkpoint.keep", absl::StrCat("is ", spec.checkpoint().keep(), "; the limit is ",
                                               kMaxCheckpointsKept));
  }
  if (spec.partition_bytes() > kMaxPartitionBytes) {
    return Bad("partition_bytes", absl::StrCat("is ", spec.partition_bytes(), "; the limit is ",
                                               kMaxPartitionBytes, " (", kMaxPartitionBytes >> 20,
                                               " MiB: a partition travels whole in one message)"));
  }
  const ModelSpec& model = spec.model();
  RETURN_IF_ERROR(CheckCount("model.input_shape", model.input_shape_size(), kMaxInputRank));
  RETURN_IF_ERROR(CheckCount("model.layer", model.layer_size(), kMaxLayers));
  for (int i = 0; i < model.layer_size(); ++i) {
    const LayerSpec& layer = model.layer(i);
    const std::string where = absl::StrCat("model.layer[", i, "]");
    RETURN_IF_ERROR(CheckBytes(absl::StrCat(where, ".name"), layer.name(), kMaxNameBytes));
    RETURN_IF_ERROR(
        CheckCount(absl::StrCat(where, ".inputs"), layer.inputs_size(), kMaxLayerInputs));
    for (int k = 0; k < layer.inputs_size(); ++k) {
      RETURN_IF_ERROR(
          CheckBytes(absl::StrCat(where, ".inputs[", k, "]"), layer.inputs(k), kMaxNameBytes));
    }
  }
  RETURN_IF_ERROR(CheckCount("model.inputs", model.inputs_size(), kMaxLayers));
  for (int i = 0; i < model.inputs_size(); ++i) {
    const InputSpec& input = model.inputs(i);
    const std::string where = absl::StrCat("model.inputs[", i, "]");
    RETURN_IF_ERROR(CheckBytes(absl::StrCat(where, ".name"), input.name(), kMaxNameBytes));
    RETURN_IF_ERROR(CheckCount(absl::StrCat(where, ".shape"), input.shape_size(), kMaxInputRank));
    RETURN_IF_ERROR(
        CheckCount(absl::StrCat(where, ".features"), input.features_size(), kMaxLayerInputs));
    for (int k = 0; k < input.features_size(); ++k) {
      RETURN_IF_ERROR(CheckBytes(absl::StrCat(where, ".features[", k, "]"), input.features(k),
                                 kMaxFeatureKeyBytes));
    }
  }
  const DatasetSpec& data = spec.dataset();
  RETURN_IF_ERROR(CheckDataPath("dataset.train_files", data.train_files()));
  RETURN_IF_ERROR(CheckDataPath("dataset.test_files", data.test_files()));
  RETURN_IF_ERROR(CheckBytes("dataset.feature_key", data.feature_key(), kMaxFeatureKeyBytes));
  RETURN_IF_ERROR(CheckBytes("dataset.label_key", data.label_key(), kMaxFeatureKeyBytes));
  return CheckSize("the job spec", spec.ByteSizeLong(), kMaxJobSpecBytes);
}

// Partitions `params` make at `partition_bytes` (as PlacePartitions cuts
// them), counted before any is made.
int64_t CountPartitions(const std::vector<ParamInfo>& params, int64_t partition_bytes) {
  const int64_t max_elements = std::max<int64_t>(1, partition_bytes / sizeof(float));
  int64_t count = 0;
  for (const ParamInfo& p : params) count += (p.num_elements + max_elements - 1) / max_elements;
  return count;
}

// JobSpec.metrics: known, each once; AUC and LOG_LOSS score P(class 1), so
// they need a two-class model.
absl::Status CheckMetrics(const JobSpec& spec) {
  std::vector<bool> listed(Metric_ARRAYSIZE, false);
  for (int i = 0; i < spec.metrics_size(); ++i) {
    const int metric = spec.metrics(i);
    if (!Metric_IsValid(metric)) {
      return Bad(absl::StrCat("metrics[", i, "]"),
                 absl::StrCat("has unknown value ", metric, "; must be ACCURACY, AUC or LOG_LOSS"));
    }
    const std::string& name = Metric_Name(spec.metrics(i));
    if (listed[metric]) return Bad("metrics", absl::StrCat("lists ", name, " twice"));
    listed[metric] = true;
    const int32_t classes = spec.model().num_classes();
    if (metric != ACCURACY && classes != 2) {
      return Bad("metrics:",
                 absl::StrCat(name, " needs a two-class model (num_classes 2), got ", classes));
    }
  }
  return absl::OkStatus();
}

// An OptimizerSpec's values (`field` names it: "optimizer", or a sparse
// table's).
absl::Status CheckOptimizer(const OptimizerSpec& opt, const std::string& field) {
  if (!OptimizerSpec::Kind_IsValid(opt.kind())) {
    return Bad(absl::StrCat(field, ".kind"), absl::StrCat("has unknown value ", opt.kind()));
  }
  if (!LearningRateSchedule::Kind_IsValid(opt.schedule().kind())) {
    return Bad(absl::StrCat(field, ".schedule.kind"),
               absl::StrCat("has unknown value ", opt.schedule().kind()));
  }
  if (!(opt.learning_rate() > 0)) {
    return Bad(absl::StrCat(field, ".learning_rate"), "must be positive");
  }
  if (opt.momentum() < 0 || opt.momentum() >= 1) {
    return Bad(absl::StrCat(field, ".momentum"), "must be in [0, 1)");
  }
  if (opt.beta1() < 0 || opt.beta1() >= 1) {
    return Bad(absl::StrCat(field, ".beta1"), "must be in [0, 1)");
  }
  if (opt.beta2() < 0 || opt.beta2() >= 1) {
    return Bad(absl::StrCat(field, ".beta2"), "must be in [0, 1)");
  }
  if (opt.epsilon() < 0) return Bad(absl::StrCat(field, ".epsilon"), "must not be negative");
  if (opt.weight_decay() < 0) {
    return Bad(absl::StrCat(field, ".weight_decay"), "must not be negative");
  }
  const LearningRateSchedule& schedule = opt.schedule();
  if (schedule.warmup_steps() < 0) {
    return Bad(absl::StrCat(field, ".schedule.warmup_steps"), "must not be negative");
  }
  if (schedule.kind() != LearningRateSchedule::CONSTANT && schedule.decay_steps() < 1) {
    return Bad(absl::StrCat(field, ".schedule.decay_steps"),
               "must be at least 1 for STEP and COSINE");
  }
  if (schedule.kind() == LearningRateSchedule::STEP &&
      !(schedule.decay_rate() > 0 && schedule.decay_rate() <= 1)) {
    return Bad(absl::StrCat(field, ".schedule.decay_rate"), "must be in (0, 1] for STEP");
  }
  return absl::OkStatus();
}

// The job's cadence and counts: workers, shards, steps, checkpoints,
// evaluations, metrics, restarts and the wire dtypes.
absl::Status CheckRunSettings(const JobSpec& spec) {
  if (spec.num_workers() < 1) return Bad("num_workers", "must be at least 1");
  if (spec.num_shards() < 1) return Bad("num_shards", "must be at least 1");
  if (spec.steps() < 1) return Bad("steps", "must be at least 1");
  if (spec.log_every_steps() < 1) return Bad("log_every_steps", "must be at least 1");
  if (spec.partition_bytes() < 1024) return Bad("partition_bytes", "must be at least 1024");
  const CheckpointSpec& checkpoint = spec.checkpoint();
  if (checkpoint.every_steps() < 0) return Bad("checkpoint.every_steps", "must not be negative");
  if (checkpoint.every_seconds() < 0) {
    return Bad("checkpoint.every_seconds", "must not be negative");
  }
  if (checkpoint.keep() < 1) return Bad("checkpoint.keep", "must be at least 1");
  if (spec.eval_every_steps() < 0) return Bad("eval_every_steps", "must not be negative");
  if (spec.stop_at_accuracy() < 0 || spec.stop_at_accuracy() > 1) {
    return Bad("stop_at_accuracy", "must be in [0, 1]");
  }
  // Only periodic evaluations can end a job early.
  if (spec.stop_at_accuracy() > 0 && spec.eval_every_steps() == 0) {
    return Bad("stop_at_accuracy",
               "needs eval_every_steps > 0 (the job is evaluated only at its end)");
  }
  RETURN_IF_ERROR(CheckMetrics(spec));
  if (spec.restart().max_restarts() < -1) {
    return Bad("restart.max_restarts", "must be -1 (never), 0 (the default, 3) or more");
  }
  if (spec.restart().backoff_seconds() < 0) {
    return Bad("restart.backoff_seconds", "must not be negative");
  }
  if (!DType_IsValid(spec.gradient_wire_dtype())) {
    return Bad("gradient_wire_dtype", "must be FLOAT32, BFLOAT16, FLOAT16 or INT8");
  }
  switch (spec.parameter_wire_dtype()) {
    case DTYPE_UNSPECIFIED:
    case FLOAT32:
      break;
    case INT8:
      // The change since the copy every worker holds: a SYNC step's pulls
      // all start from the same one.
      if (spec.consistency().mode() != ConsistencySpec::SYNC) {
        return Bad("parameter_wire_dtype",
                   "INT8 applies to consistency mode SYNC only (the workers of ASYNC and SSP "
                   "jobs hold parameters of different versions)");
      }
      break;
    default:
      return Bad("parameter_wire_dtype", "must be FLOAT32 or INT8");
  }
  return absl::OkStatus();
}

// The dataset's files and batches.
absl::Status CheckDatasetFields(const DatasetSpec& data) {
  if (data.train_files().empty()) return Bad("dataset.train_files", "is required");
  if (data.test_files().empty()) return Bad("dataset.test_files", "is required");
  if (data.batch_size() < 1) return Bad("dataset.batch_size", "must be at least 1");
  if (data.shuffle_buffer() < 0) return Bad("dataset.shuffle_buffer", "must not be negative");
  return absl::OkStatus();
}

// How the dataset's records are stored and decoded.
absl::Status CheckDatasetFormat(const DatasetSpec& data) {
  if (!DatasetSpec::Compression_IsValid(data.compression())) {
    return Bad("dataset.compression", absl::StrCat("has unknown value ", data.compression(),
                                                   "; must be AUTO, NONE or GZIP"));
  }
  if (!DatasetSpec::Encoding_IsValid(data.encoding())) {
    return Bad("dataset.encoding", absl::StrCat("has unknown value ", data.encoding(),
                                                "; must be BY_SIZE, RAW or ENCODED"));
  }
  if (data.decode_threads() < 0 || data.decode_threads() > 64) {
    return Bad("dataset.decode_threads", "must be in [0, 64] (0: automatic)");
  }
  return absl::OkStatus();
}

// JobSpec.consistency: its mode, and the fields each mode takes.
absl::Status CheckConsistency(const JobSpec& spec) {
  const ConsistencySpec& consistency = spec.consistency();
  if (!ConsistencySpec::Mode_IsValid(consistency.mode())) {
    return Bad("consistency.mode", absl::StrCat("has unknown value ", consistency.mode()));
  }
  if (consistency.staleness() < 0) return Bad("consistency.staleness", "must not be negative");
  if (consistency.staleness() > 0 && consistency.mode() != ConsistencySpec::SSP) {
    return Bad("consistency.staleness", "applies to mode SSP only");
  }
  if (consistency.backup_workers() < 0 || consistency.backup_workers() >= spec.num_workers()) {
    return Bad("consistency.backup_workers",
               absl::StrCat("must be in [0, num_workers) = [0, ", spec.num_workers(), ")"));
  }
  for (const auto& [field, value] :
       {std::pair<const char*, int>{"consistency.push_every", consistency.push_every()},
        {"consistency.fetch_every", consistency.fetch_every()}}) {
    if (value < 0) return Bad(field, "must not be negative");
    if (value > 1 && consistency.mode() == ConsistencySpec::SYNC) {
      return Bad(field, "applies to modes ASYNC and SSP only (a SYNC step is every worker's)");
    }
  }
  if (consistency.backup_workers() > 0 && consistency.mode() != ConsistencySpec::SYNC) {
    return Bad("consistency.backup_workers", "applies to mode SYNC only");
  }
  return absl::OkStatus();
}

// The optimizer of each sparse table.
absl::Status CheckSparseTables(const JobSpec& spec, const ModelShape& shape) {
  for (const SparseTableInfo& table : shape.sparse_tables) {
    RETURN_IF_ERROR(ValidateSparseTableOptimizer(table, spec.optimizer()));
  }
  return absl::OkStatus();
}

// What the dataset's decoding and augmentation need of the model's input.
absl::Status CheckDatasetFitsModel(const DatasetSpec& data, const ModelShape& shape) {
  const std::vector<int64_t>& input = shape.input_shape;
  const bool image_input = input.size() == 3 && (input[2] == 1 || input[2] == 3);
  if (data.encoding() == DatasetSpec::ENCODED && !image_input) {
    return Bad("dataset.encoding",
               "ENCODED needs model.input_shape [height, width, channels] with 1 (grayscale) or "
               "3 (RGB) channels");
  }
  const bool augmented = data.has_random_crop() || data.random_flip_left_right();
  if (augmented && input.size() != 3) {
    return Bad(data.has_random_crop() ? "dataset.random_crop" : "dataset.random_flip_left_right",
               "needs model.input_shape [height, width, channels]");
  }
  if (data.has_random_crop()) {
    const int32_t padding = data.random_crop().padding();
    if (padding < 0 || padding > input[0] || padding > input[1]) {
      return Bad("dataset.random_crop.padding",
                 absl::StrCat("must be in [0, ", std::min(input[0], input[1]),
                              "] (the input's height and width); got ", padding));
    }
  }
  return absl::OkStatus();
}

// Bounds that keep a typo from exhausting a worker's or a shard's memory:
// a batch, the parameters, and the partitions every node is sent.
absl::Status CheckMemoryBounds(const JobSpec& spec, const ModelShape& shape) {
  const DatasetSpec& data = spec.dataset();
  const double batch_bytes = 4.0 * data.batch_size() * shape.input_size;
  if (batch_bytes > kMaxBatchBytes) {
    return Bad("dataset.batch_size",
               absl::StrCat(data.batch_size(), " makes one batch of ", shape.input_size,
                            "-element examples ", static_cast<int64_t>(batch_bytes) >> 20,
                            " MiB; the limit is ", kMaxBatchBytes >> 20, " MiB"));
  }
  double param_bytes = 0;
  for (const ParamInfo& p : shape.params) param_bytes += 4.0 * p.num_elements;
  if (param_bytes > kMaxModelBytes) {
    return Bad("model",
               absl::StrCat("has ", static_cast<int64_t>(param_bytes) >> 20,
                            " MiB of parameters; the limit is ", kMaxModelBytes >> 20, " MiB"));
  }
  const int64_t partitions = CountPartitions(shape.params, spec.partition_bytes());
  if (partitions > kMaxPartitions) {
    return Bad("partition_bytes",
               absl::StrCat(spec.partition_bytes(), " cuts the model's ",
                            static_cast<int64_t>(param_bytes) >> 20, " MiB into ", partitions,
                            " partitions; the limit is ", kMaxPartitions,
                            " (every node is sent the placement): use larger partitions"));
  }
  return absl::OkStatus();
}

}  // namespace

void ApplyJobDefaults(JobSpec* spec) {
  if (spec->partition_bytes() == 0) spec->set_partition_bytes(kDefaultPartitionBytes);
  if (spec->log_every_steps() == 0) spec->set_log_every_steps(10);
  DatasetSpec* data = spec->mutable_dataset();
  if (data->feature_key().empty()) data->set_feature_key("image");
  if (data->label_key().empty()) data->set_label_key("label");
  if (spec->name().empty()) spec->set_name("job");
  if (spec->checkpoint().keep() == 0) spec->mutable_checkpoint()->set_keep(2);
}

absl::StatusOr<std::vector<ParamInfo>> ValidateJobSpec(const JobSpec& spec) {
  RETURN_IF_ERROR(CheckSizes(spec));
  RETURN_IF_ERROR(CheckRunSettings(spec));
  RETURN_IF_ERROR(CheckDatasetFields(spec.dataset()));
  if (!Precision_IsValid(spec.precision())) {
    return Bad("precision", absl::StrCat("has unknown value ", spec.precision(),
                                         "; must be FP32 (the default), TF32, FP32_STRICT, "
                                         "BF16 or FP16"));
  }
  RETURN_IF_ERROR(CheckOptimizer(spec.optimizer(), "optimizer"));
  RETURN_IF_ERROR(CheckConsistency(spec));
  RETURN_IF_ERROR(CheckDatasetFormat(spec.dataset()));
  ASSIGN_OR_RETURN(const ModelShape shape, InferModel(spec.model()));
  RETURN_IF_ERROR(CheckSparseTables(spec, shape));
  RETURN_IF_ERROR(CheckDatasetFitsModel(spec.dataset(), shape));
  RETURN_IF_ERROR(CheckMemoryBounds(spec, shape));
  RETURN_IF_ERROR(
      PlacePartitions(shape.params, spec.num_shards(), spec.partition_bytes()).status());
  return shape.params;
}

absl::Status ValidateSparseTableOptimizer(const SparseTableInfo& table,
                                          const OptimizerSpec& job_optimizer) {
  const OptimizerSpec& optimizer = table.has_optimizer ? table.optimizer : job_optimizer;
  RETURN_IF_ERROR(CheckOptimizer(
      optimizer, table.has_optimizer ? SparseTableOptimizerField(table) : "optimizer"));
  return CheckSparseTableOptimizerKind(table, optimizer.kind());
}

absl::Status ValidateJobId(const std::string& job_id) {
  RETURN_IF_ERROR(CheckBytes("the job id", job_id, kMaxJobIdBytes));
  if (job_id.empty() || !std::isalnum(static_cast<uint8_t>(job_id[0]))) {
    return absl::InvalidArgumentError(absl::StrCat("job id \"", job_id, "\" must be 1 to ",
                                                   kMaxJobIdBytes,
                                                   " characters starting with a letter or digit"));
  }
  for (char c : job_id) {
    if (!std::isalnum(static_cast<uint8_t>(c)) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("job id \"", job_id, "\" may hold only letters, digits, '.', '_', '-'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace downpour
