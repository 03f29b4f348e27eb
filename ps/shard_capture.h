// ShardCapture: a shard's part of a checkpoint as the ParameterStore captured
// it, on its way to the CheckpointWriter: the checkpoint's fields and its
// partitions' arrays, borrowed from the store rather than copied. The store
// leaves a captured partition's arrays untouched (a push that updates the
// partition writes fresh arrays instead; ps/parameter_store.h) until the
// capture is destroyed, which hands them back. A job's sparse tables come
// through the lease too (a SparseCapture, ps/sparse_store.h): their rows are
// copied into the capture's fields by Detach, on the writer's thread,
// unless the store had to copy them first.
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
    // Sets `info`'s sparse tables (ShardSnapshot::has_sparse and after), if
    // the capture has any; `keep`: a copy, so that a later call gets them
    // too. Called once with keep false at most (Detach).
    virtual void TakeTables(ShardSnapshot* info, bool keep) {}
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
  // The sparse tables are there once detached (Copy has them before).
  const ShardSnapshot& info() const { return info_; }
  const std::vector<PartitionArrays>& partitions() const { return partitions_; }
  // The whole snapshot, its arrays copied.
  ShardSnapshot Copy() const;
  // Copies each borrowed partition that no update has reached since the
  // capture into arrays of the capture's own (the store's spare ones: no
  // allocation), holding no lock of the store while it copies, and ends its
  // loan: the updates after that go in place; and puts the sparse tables'
  // rows into info(). The writer calls it as soon as it takes the capture,
  // while the workers compute.
  void Detach();

 private:
  ShardSnapshot info_;
  bool tables_taken_ = false;  // info_ holds the sparse tables.
  std::vector<PartitionArrays> partitions_;
  // Declared last: destroyed first, after nothing reads the arrays.
  std::unique_ptr<Lease> lease_;
};

}  // namespace downpour

#endif  // DOWNPOUR_PS_SHARD_CAPTURE_H_
