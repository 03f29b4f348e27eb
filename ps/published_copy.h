// PublishedCopy: a SYNC partition's values as the workers that pull INT8
// changes hold them (JobSpec.parameter_wire_dtype). The shard advances the
// copy by exactly what it sends, the int8 change from the copy to its
// values (common/wire_dtype.h: EncodeInt8Change, AddInt8), so every worker
// that applied the changes holds it bit for bit; the copy trails the
// values by one change's rounding, which the next change carries.
//
// A copy is named by a random `lineage`, drawn when it is made from the
// values (the first pull, or the first after Drop: a restore), and a
// version, the partition's version it was last brought to. The change that
// brought it there is kept, encoded once, for every worker still holding
// the version before (the same bytes to each, and to a retried pull);
// a worker holding anything else is sent the copy whole.
//
// Thread-compatible: the owner (a partition, under its mutex) serialises
// every call.
#ifndef DOWNPOUR_PS_PUBLISHED_COPY_H_
#define DOWNPOUR_PS_PUBLISHED_COPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/parameter_server.pb.h"
#include "proto/tensor.pb.h"

namespace downpour {

class PublishedCopy {
 public:
  // What a worker says it holds: (lineage, version); (0, -1) for nothing.
  struct Held {
    uint64_t lineage = 0;
    int64_t version = -1;
  };

  // Brings the copy to `values` (n floats) at `version`, then writes it for
  // a worker holding `held` at `out`: the change where the worker holds the
  // copy the last change started from, else the copy whole in float32.
  // Fills `header`'s dtype, version, lineage, change and base_version.
  // Returns the end of what it wrote (at most 4 n bytes).
  char* Write(const float* values, int64_t n, int64_t version, Held held, PartitionHeader* header,
              char* out);

  // Forgets the copy (the values were replaced): the next Write makes a new
  // one, under a new lineage.
  void Drop() { lineage_ = 0; }

  // Bytes held: the copy and the last change.
  int64_t MemoryBytes() const {
    return static_cast<int64_t>(copy_.capacity() * sizeof(float) + change_.capacity());
  }

 private:
  void Advance(const float* values, int64_t n, int64_t version);

  std::vector<float> copy_;
  uint64_t lineage_ = 0;  // 0: no copy.
  int64_t version_ = -1;
  std::vector<char> change_;
  int64_t change_base_ = -1;  // The version change_ starts from; -1: none.
};

// Whether a pull of job `job_id` asks for its partitions as changes to the
// published copy (PullRequest.change_dtype INT8), or an error naming what is
// wrong with it; `int8_pulls`: the job was added pulled as INT8 (its copies'
// memory reserved).
absl::StatusOr<bool> WantsChanges(const std::string& job_id, bool int8_pulls,
                                  const PullRequest& request);

// The published copy the puller of `request` holds of its k-th key.
PublishedCopy::Held HeldOf(const PullRequest& request, size_t k);

}  // namespace downpour

#endif  // DOWNPOUR_PS_PUBLISHED_COPY_H_
