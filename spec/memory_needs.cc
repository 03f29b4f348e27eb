#include "spec/memory_needs.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/status.h"
#include "common/wire_dtype.h"

namespace downpour {
namespace {

constexpr int64_t kFloatBytes = 4;
// A sparse row beside its floats: its id, its place in the table's index
// and its eviction bookkeeping (ps/sparse_table.h measures about this).
constexpr int64_t kSparseRowOverheadBytes = 40;

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= std::max<int64_t>(d, 1);
  return n;
}

}  // namespace

int OptimizerSlots(OptimizerSpec::Kind kind) {
  switch (kind) {
    case OptimizerSpec::SGD:
      return 0;
    case OptimizerSpec::MOMENTUM:
    case OptimizerSpec::ADAGRAD:
      return 1;
    case OptimizerSpec::ADAM:
      return 2;
    default:
      return 0;
  }
}

int64_t ShardPartitionBytes(const std::vector<PartitionPlacement>& partitions, int shard, int slots,
                            bool checkpoints, bool sync, bool int8_pulls) {
  int64_t bytes = 0;
  for (const PartitionPlacement& placement : partitions) {
    if (placement.shard() != shard) continue;
    const int64_t n = placement.num_elements();
    // SYNC: the step's sum and the previous version's values.
    bytes += n * ((1 + slots) * (checkpoints ? 2 : 1) + (sync ? 2 : 0)) * kFloatBytes;
    if (int8_pulls) bytes += n * kFloatBytes + WireBytes(WireDtype::kInt8, n);
  }
  return bytes;
}

absl::StatusOr<std::vector<int64_t>> ShardMemoryNeeds(
    const JobSpec& spec, const std::vector<PartitionPlacement>& partitions, bool checkpoints) {
  const bool sync = spec.consistency().mode() == ConsistencySpec::SYNC;
  const int slots = OptimizerSlots(spec.optimizer().kind());
  std::vector<int64_t> needs(spec.num_shards());
  for (int shard = 0; shard < spec.num_shards(); ++shard) {
    needs[shard] = ShardPartitionBytes(partitions, shard, slots, checkpoints, sync,
                                       spec.parameter_wire_dtype() == INT8);
  }
  ASSIGN_OR_RETURN(ModelShape shape, InferModel(spec.model()));
  for (const SparseTableInfo& table : shape.sparse_tables) {
    if (table.max_rows <= 0) continue;
    const int table_slots =
        OptimizerSlots(table.has_optimizer ? table.optimizer.kind() : spec.optimizer().kind());
    const int64_t row_bytes = table.dim * (1 + table_slots) * kFloatBytes * (checkpoints ? 2 : 1) +
                              kSparseRowOverheadBytes;
    // A table's rows are spread over every shard by id.
    const int64_t per_shard = (table.max_rows + spec.num_shards() - 1) / spec.num_shards();
    for (int64_t& need : needs) need += per_shard * row_bytes;
  }
  return needs;
}

int64_t WorkerMemoryNeed(const ModelShape& shape, int64_t batch, bool int8_gradients) {
  int64_t params = 0;
  for (const ParamInfo& p : shape.params) params += p.num_elements;
  int64_t activations = Product(shape.input_shape);
  for (const LayerShape& layer : shape.layers) activations += Product(layer.output_shape);
  const int64_t int8 =
      int8_gradients ? kFloatBytes * params + WireBytes(WireDtype::kInt8, params) : 0;
  return kFloatBytes * (2 * params + 2 * batch * activations) + int8;
}

std::string ByteSize(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) return absl::StrFormat("%.1f GiB", b / (1 << 30));
  if (bytes >= (int64_t{1} << 20)) return absl::StrFormat("%.1f MiB", b / (1 << 20));
  return absl::StrFormat("%.1f KiB", b / 1024);
}

}  // namespace downpour
