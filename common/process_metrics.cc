#include "common/process_metrics.h"

#include <dirent.h>
#include <malloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/build_info.h"

namespace downpour {
namespace {

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status Unparsable(const std::string& path) {
  return absl::DataLossError(absl::StrCat("cannot parse ", path));
}

}  // namespace

absl::StatusOr<ProcessStats> ReadProcessStats(const std::string& proc_root,
                                              const std::string& pid) {
  const std::string dir = absl::StrCat(proc_root, "/", pid);
  ProcessStats stats;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));

  // PID/stat: "pid (comm) state ppid ..."; comm may hold spaces and
  // parentheses, so the fields are counted from the last ')'. Field 3
  // (state) is fields[0]: utime 14, stime 15, starttime 22, vsize 23, rss 24.
  const std::string stat_path = dir + "/stat";
  auto stat = ReadWhole(stat_path);
  if (!stat.ok()) return stat.status();
  const size_t close = stat->rfind(')');
  if (close == std::string::npos) return Unparsable(stat_path);
  const std::vector<std::string> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(stat->substr(close + 1)), ' ', absl::SkipEmpty());
  double utime, stime, starttime, vsize, rss;
  if (fields.size() < 22 || !absl::SimpleAtod(fields[11], &utime) ||
      !absl::SimpleAtod(fields[12], &stime) || !absl::SimpleAtod(fields[19], &starttime) ||
      !absl::SimpleAtod(fields[20], &vsize) || !absl::SimpleAtod(fields[21], &rss)) {
    return Unparsable(stat_path);
  }
  stats.cpu_seconds = (utime + stime) / ticks;
  stats.virtual_bytes = vsize;
  stats.resident_bytes = rss * page;

  // The boot time, which starttime counts from ("btime SECONDS" in stat).
  const std::string boot_path = proc_root + "/stat";
  auto boot = ReadWhole(boot_path);
  if (!boot.ok()) return boot.status();
  double btime = -1;
  for (absl::string_view line : absl::StrSplit(*boot, '\n')) {
    if (absl::ConsumePrefix(&line, "btime ") &&
        !absl::SimpleAtod(absl::StripAsciiWhitespace(line), &btime)) {
      return Unparsable(boot_path);
    }
  }
  if (btime < 0) return Unparsable(boot_path);
  stats.start_time_seconds = btime + starttime / ticks;

  // PID/limits: "Max open files  SOFT  HARD  files".
  const std::string limits_path = dir + "/limits";
  auto limits = ReadWhole(limits_path);
  if (!limits.ok()) return limits.status();
  bool found = false;
  for (absl::string_view line : absl::StrSplit(*limits, '\n')) {
    if (!absl::ConsumePrefix(&line, "Max open files")) continue;
    const std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.empty()) return Unparsable(limits_path);
    if (words[0] == "unlimited") {
      stats.max_fds = std::numeric_limits<double>::infinity();
      found = true;
    } else {
      found = absl::SimpleAtod(words[0], &stats.max_fds);
    }
    if (!found) return Unparsable(limits_path);
  }
  if (!found) return Unparsable(limits_path);

  const std::string fd_path = dir + "/fd";
  DIR* fds = opendir(fd_path.c_str());
  if (fds == nullptr) return absl::NotFoundError(absl::StrCat("cannot list ", fd_path));
  int open = 0;
  while (dirent* entry = readdir(fds)) {
    if (entry->d_name[0] != '.') ++open;
  }
  closedir(fds);
  // Listing the directory held one descriptor of our own.
  stats.open_fds = pid == "self" && open > 0 ? open - 1 : open;
  return stats;
}

absl::StatusOr<double> ReadMemoryLimit(const std::string& proc_root, const std::string& cgroup_root,
                                       const std::string& pid) {
  const std::string meminfo_path = proc_root + "/meminfo";
  auto meminfo = ReadWhole(meminfo_path);
  if (!meminfo.ok()) return meminfo.status();
  double limit = -1;
  for (absl::string_view line : absl::StrSplit(*meminfo, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemTotal:")) continue;
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumeSuffix(&line, " kB") ||
        !absl::SimpleAtod(absl::StripAsciiWhitespace(line), &limit)) {
      return Unparsable(meminfo_path);
    }
    limit *= 1024;
  }
  if (limit < 0) return Unparsable(meminfo_path);

  // The cgroup files that may hold a limit: v2's memory.max of the process's
  // own group ("0::/PATH" in PID/cgroup), v1's memory controller.
  std::vector<std::string> candidates = {cgroup_root + "/memory/memory.limit_in_bytes"};
  auto groups = ReadWhole(absl::StrCat(proc_root, "/", pid, "/cgroup"));
  if (groups.ok()) {
    for (absl::string_view line : absl::StrSplit(*groups, '\n')) {
      if (absl::ConsumePrefix(&line, "0::")) {
        candidates.push_back(absl::StrCat(cgroup_root, line == "/" ? "" : line, "/memory.max"));
      }
    }
  }
  for (const std::string& path : candidates) {
    auto text = ReadWhole(path);
    if (!text.ok()) continue;  // No such controller: no limit there.
    const absl::string_view value = absl::StripAsciiWhitespace(*text);
    if (value == "max") continue;
    double bytes = 0;
    if (!absl::SimpleAtod(value, &bytes)) return Unparsable(path);
    // v1 writes a huge number for "no limit"; the machine's bounds it.
    limit = std::min(limit, bytes);
  }
  return limit;
}

int ReadCpuLimit(int cores, const std::string& proc_root, const std::string& cgroup_root,
                 const std::string& pid) {
  int limit = std::max(cores, 1);
  // Quota and period, in microseconds; quota < 0 ("max", v1's -1): none.
  auto apply = [&](double quota, double period) {
    if (quota > 0 && period > 0) {
      limit = std::min(limit, std::max(1, static_cast<int>(std::ceil(quota / period))));
    }
  };
  auto groups = ReadWhole(absl::StrCat(proc_root, "/", pid, "/cgroup"));
  if (groups.ok()) {
    for (absl::string_view line : absl::StrSplit(*groups, '\n')) {
      if (!absl::ConsumePrefix(&line, "0::")) continue;
      // The group's quota and every ancestor's (a slice's CPUQuota bounds
      // the services under it).
      std::string group(absl::StripSuffix(line, "/"));
      while (true) {
        auto text = ReadWhole(absl::StrCat(cgroup_root, group, "/cpu.max"));
        std::vector<absl::string_view> fields;
        if (text.ok()) {
          fields = absl::StrSplit(absl::StripAsciiWhitespace(*text), ' ', absl::SkipEmpty());
        }
        double quota = 0, period = 0;
        if (fields.size() == 2 && fields[0] != "max" && absl::SimpleAtod(fields[0], &quota) &&
            absl::SimpleAtod(fields[1], &period)) {
          apply(quota, period);
        }
        const size_t slash = group.rfind('/');
        if (group.empty() || slash == std::string::npos) break;
        group.resize(slash);
      }
    }
  }
  auto quota_text = ReadWhole(cgroup_root + "/cpu/cpu.cfs_quota_us");
  auto period_text = ReadWhole(cgroup_root + "/cpu/cpu.cfs_period_us");
  double quota = 0, period = 0;
  if (quota_text.ok() && period_text.ok() &&
      absl::SimpleAtod(absl::StripAsciiWhitespace(*quota_text), &quota) &&
      absl::SimpleAtod(absl::StripAsciiWhitespace(*period_text), &period)) {
    apply(quota, period);
  }
  return limit;
}

int UsableCores() {
  static const int cores = [] {
    int allowed = static_cast<int>(std::thread::hardware_concurrency());
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) allowed = CPU_COUNT(&set);
    return ReadCpuLimit(allowed);
  }();
  return cores;
}

void AddMemoryLimit(MetricsRegistry* registry, const std::string& name, const std::string& help) {
  Gauge* gauge = registry->GetGauge(name, help);
  auto collect = [gauge] {
    absl::StatusOr<double> limit = ReadMemoryLimit();
    if (limit.ok()) gauge->Set(*limit);
  };
  collect();
  registry->AddCollector(collect);
}

void AddProcessMetrics(MetricsRegistry* registry) {
  Counter* cpu = registry->GetCounter("process_cpu_seconds_total",
                                      "Total user and system CPU time spent in seconds.");
  Gauge* resident =
      registry->GetGauge("process_resident_memory_bytes", "Resident memory size in bytes.");
  Gauge* virtual_bytes =
      registry->GetGauge("process_virtual_memory_bytes", "Virtual memory size in bytes.");
  Gauge* open_fds = registry->GetGauge("process_open_fds", "Number of open file descriptors.");
  Gauge* max_fds =
      registry->GetGauge("process_max_fds", "Maximum number of open file descriptors.");
  Gauge* start = registry->GetGauge("process_start_time_seconds",
                                    "Start time of the process since unix epoch in seconds.");
  Gauge* malloc_in_use = registry->GetGauge(
      "downpour_malloc_in_use_bytes",
      "Bytes malloc has handed out and not had back: what the process holds live.");
  Gauge* malloc_free = registry->GetGauge(
      "downpour_malloc_free_bytes",
      "Bytes malloc holds free, for reuse, in its arenas (resident where touched and not yet "
      "returned): resident memory far above downpour_malloc_in_use_bytes is this.");
  auto collect = [=] {
    // Counts every arena's free chunks under its lock: for a scrape, not a
    // hot path.
    const struct mallinfo2 heap = mallinfo2();
    malloc_in_use->Set(static_cast<double>(heap.uordblks + heap.hblkhd));
    malloc_free->Set(static_cast<double>(heap.fordblks));
    absl::StatusOr<ProcessStats> stats = ReadProcessStats();
    if (!stats.ok()) return;
    cpu->RaiseTo(stats->cpu_seconds);
    resident->Set(stats->resident_bytes);
    virtual_bytes->Set(stats->virtual_bytes);
    open_fds->Set(stats->open_fds);
    max_fds->Set(stats->max_fds);
    start->Set(stats->start_time_seconds);
  };
  collect();
  registry->AddCollector(collect);
}

absl::StatusOr<int64_t> ParseMemoryLimitFlag(const std::string& flag, const std::string& value,
                                             double share) {
  if (value == "auto") {
    absl::StatusOr<double> may_use = ReadMemoryLimit();
    return may_use.ok() ? static_cast<int64_t>(share * *may_use) : 0;
  }
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(value, &bytes) || bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", value, " is not a memory limit: give auto (",
                     static_cast<int>(share * 100),
                     "% of what this process may use: its cgroup's limit, else the machine's "
                     "memory), 0 (no limit) or a number of bytes"));
  }
  return bytes;
}

void AddBuildInfo(MetricsRegistry* registry, const std::string& daemon) {
  registry
      ->GetGauge("downpour_build_info",
                 "Always 1; the labels say which daemon, release and commit this is.",
                 {{"daemon", daemon}, {"version", BuildVersion()}, {"commit", BuildCommit()}})
      ->Set(1);
}

}  // namespace downpour
