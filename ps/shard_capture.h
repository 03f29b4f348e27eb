// ShardCapture: a shard's part of a checkpoint as the ParameterStore captured
// it, on its way to the CheckpointWriter: the checkpoint's fields and its
// partitions' arrays, borrowed from the store rather than copied. The store
// leaves a captured partition's arrays untouched (a push that updates the
// partition writes fresh arrays instead; ps/parameter_store.h) until the
// capture is destroyed, which hands them back.
//
// Thread-safety: thread-compatible. A capture may be moved to, and destroyed
// on, any thread that holds no lock of the store. Ownership: a capture owns
// its lease on the arrays (or, made by Owning, the snapshot they are in).
#ifndef DOWNPOUR_PS_SHARD_CAPTURE_H_
#define DOWNPOUR_PS_SHARD_CAPTURE_H_

#include <memory>
#include <vector>

#include "spec/checkpoint_files.h"

namespace downpour {

class ShardCapture {
 public:
  // What a capture borrows: destroying the lease hands it back.
  class Lease {
   public:
    virtual ~Lease() = default;
    // See ShardCapture::Detach; `partitions` are the capture's.
    virtual void Detach(std::vector<PartitionArrays>* partitions) {}
  };

  ShardCapture() = default;
  // `info`'s fields, its partitions aside: `partitions` (sorted by
  // (tensor, partition)) hold arrays valid while `lease` lives.
  ShardCapture(ShardSnapshot info, std::vector<PartitionArrays> partitions,
               std::unique_ptr<Lease> lease);
  ShardCapture(ShardCapture&&) = default;
  ShardCapture& operator=(ShardCapture&&) = default;

  // A capture of `snapshot` that owns it (tests, tools).
  static ShardCapture Owning(ShardSnapshot snapshot);

  // The checkpoint's fields; info().partitions is empty: see partitions().
  const ShardSnapshot& info() const { return info_; }
  const std::vector<PartitionArrays>& partitions() const { return partitions_; }
  // The whole snapshot, its arrays copied.
  ShardSnapshot Copy() const;
  // Copies each borrowed partition that no update has reached since the
  // capture into arrays of the capture's own (the store's spare ones: no
  // allocation), holding no lock of the store while it copies, and ends its
  // loan: the updates after that go in place. The writer calls it as soon as
  // it takes the capture, while the workers compute.
  void Detach() {
    if (lease_ != nullptr) lease_->Detach(&partitions_);
  }

 private:
  ShardSnapshot info_;
  std::vector<PartitionArrays> partitions_;
  // Declared last: destroyed first, after nothing reads the arrays.
  std::unique_ptr<Lease> lease_;
};

}  // namespace downpour

#endif  // DOWNPOUR_PS_SHARD_CAPTURE_H_
