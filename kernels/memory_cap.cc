#include "kernels/memory_cap.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace downpour {
namespace kernels {

std::string DescribeBytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) {
    return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  }
  if (bytes >= (int64_t{1} << 20)) {
    return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  }
  if (bytes >= (int64_t{1} << 10)) {
    return absl::StrFormat("%.1f KiB", static_cast<double>(bytes) / (1 << 10));
  }
  return absl::StrCat(bytes, " bytes");
}

std::shared_ptr<MemoryCap> MemoryCaps::For(const std::string& device) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<MemoryCap>& cap = caps_[device];
  if (cap == nullptr) cap = std::make_shared<MemoryCap>(limit_, device);
  return cap;
}

std::shared_ptr<MemoryCap> CapFor(const BackendOptions& options, const std::string& device) {
  if (options.shared_caps != nullptr) return options.shared_caps->For(device);
  return std::make_shared<MemoryCap>(options.memory_limit, device);
}

absl::Status MemoryCap::Take(size_t bytes, int64_t others) {
  const int64_t want = static_cast<int64_t>(bytes);
  const int64_t before = held_.fetch_add(want);
  if (limit_ <= 0 || before + others + want <= limit_) return absl::OkStatus();
  held_.fetch_sub(want);
  return absl::ResourceExhaustedError(
      absl::StrCat(device_, ": allocating ", DescribeBytes(want), " would hold ",
                   DescribeBytes(before + others + want), " of compute memory, over the limit of ",
                   DescribeBytes(limit_), " (--device_memory_limit); ",
                   DescribeBytes(before + others), " held"));
}

}  // namespace kernels
}  // namespace downpour
