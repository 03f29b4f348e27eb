#include "ps/shard_capture.h"

#include <utility>

namespace downpour {
namespace {

// The partitions of a snapshot a capture was made of.
class OwnedPartitions : public ShardCapture::Lease {
 public:
  explicit OwnedPartitions(std::vector<PartitionSnapshot> partitions)
      : partitions_(std::move(partitions)) {}
  const std::vector<PartitionSnapshot>& partitions() const { return partitions_; }

 private:
  const std::vector<PartitionSnapshot> partitions_;
};

}  // namespace

ShardCapture::ShardCapture(ShardSnapshot info, std::vector<PartitionArrays> partitions,
                           std::unique_ptr<Lease> lease)
    : info_(std::move(info)), partitions_(std::move(partitions)), lease_(std::move(lease)) {
  info_.partitions.clear();
}

ShardCapture ShardCapture::Owning(ShardSnapshot snapshot) {
  // Moving a vector keeps its elements where they are: the arrays stay put.
  auto owned = std::make_unique<OwnedPartitions>(std::move(snapshot.partitions));
  std::vector<PartitionArrays> arrays;
  arrays.reserve(owned->partitions().size());
  for (const PartitionSnapshot& p : owned->partitions()) arrays.push_back(ArraysOf(p));
  return ShardCapture(std::move(snapshot), std::move(arrays), std::move(owned));
}

void ShardCapture::Detach() {
  if (lease_ == nullptr) return;
  lease_->Detach(&partitions_);
  if (!tables_taken_) lease_->TakeTables(&info_, /*keep=*/false);
  tables_taken_ = true;
}

ShardSnapshot ShardCapture::Copy() const {
  ShardSnapshot snapshot = info_;
  if (!tables_taken_ && lease_ != nullptr) lease_->TakeTables(&snapshot, /*keep=*/true);
  snapshot.partitions.reserve(partitions_.size());
  for (const PartitionArrays& a : partitions_) {
    PartitionSnapshot p;
    p.tensor_id = a.tensor_id;
    p.partition = a.partition;
    p.offset = a.offset;
    p.version = a.version;
    p.updates = a.updates;
    p.values.assign(a.values, a.values + a.num_elements);
    for (const float* slot : a.slots) p.slots.emplace_back(slot, slot + a.num_elements);
    snapshot.partitions.push_back(std::move(p));
  }
  return snapshot;
}

}  // namespace downpour
