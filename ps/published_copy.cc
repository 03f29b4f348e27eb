#include "ps/published_copy.h"

#include <atomic>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/splitmix64.h"
#include "common/wire_dtype.h"

namespace downpour {
namespace {

// A new copy's name: never 0, and not one an earlier copy of this process
// or (with overwhelming odds) of another shard had.
uint64_t NewLineage() {
  static std::atomic<uint64_t> next{(static_cast<uint64_t>(std::random_device()()) << 32) ^
                                    std::random_device()()};
  return SplitMix64(next.fetch_add(1, std::memory_order_relaxed)) | 1;
}

}  // namespace

void PublishedCopy::Advance(const float* values, int64_t n, int64_t version) {
  if (lineage_ == 0) {
    copy_.assign(values, values + n);
    lineage_ = NewLineage();
    version_ = version;
    change_base_ = -1;
    return;
  }
  if (version_ == version) return;
  change_.resize(WireBytes(WireDtype::kInt8, n));
  EncodeInt8Change(values, n, copy_.data(), change_.data());
  change_base_ = version_;
  version_ = version;
}

char* PublishedCopy::Write(const float* values, int64_t n, int64_t version, Held held,
                           PartitionHeader* header, char* out) {
  Advance(values, n, version);
  header->set_lineage(lineage_);
  header->set_version(version_);
  if (held.lineage == lineage_ && change_base_ >= 0 && held.version == change_base_) {
    header->set_dtype(INT8);
    header->set_change(true);
    header->set_base_version(change_base_);
    std::memcpy(out, change_.data(), change_.size());
    return out + change_.size();
  }
  header->set_dtype(FLOAT32);
  std::memcpy(out, copy_.data(), n * sizeof(float));
  return out + n * sizeof(float);
}

absl::StatusOr<bool> WantsChanges(const std::string& job_id, bool int8_pulls,
                                  const PullRequest& request) {
  if (request.change_dtype() == DTYPE_UNSPECIFIED || request.change_dtype() == FLOAT32) {
    return false;
  }
  const std::string where = absl::StrCat("pull from job ", job_id, ": ");
  if (request.change_dtype() != INT8) {
    return absl::InvalidArgumentError(absl::StrCat(where, "change_dtype ",
                                                   static_cast<int>(request.change_dtype()),
                                                   " is not INT8 (", static_cast<int>(INT8), ")"));
  }
  // The copy's memory was reserved with the job (AddJob) only for these.
  if (!int8_pulls) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "INT8 changes are for a SYNC job whose parameter_wire_dtype is INT8"));
  }
  // Changes are not float-aligned: nothing follows them (sparse rows are
  // floats) and they are not mixed with other answers.
  if (request.exact_version() || request.reduced_tensor_ids_size() > 0 ||
      request.sparse_size() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "INT8 changes go with neither exact_version, reduced_tensor_ids nor sparse rows"));
  }
  if (request.held_lineage_size() != request.held_version_size() ||
      (request.held_lineage_size() > 0 && request.held_lineage_size() != request.keys_size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "held_lineage (", request.held_lineage_size(), ") and held_version (",
                     request.held_version_size(), ") must both be empty or one per key (",
                     request.keys_size(), ")"));
  }
  return true;
}

PublishedCopy::Held HeldOf(const PullRequest& request, size_t k) {
  if (static_cast<int>(k) >= request.held_lineage_size()) return {};
  return {request.held_lineage(static_cast<int>(k)), request.held_version(static_cast<int>(k))};
}

}  // namespace downpour
