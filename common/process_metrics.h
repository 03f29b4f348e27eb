// The metrics every Downpour daemon exports about itself, with the names and
// meanings Prometheus' own clients use: process_cpu_seconds_total,
// process_resident_memory_bytes, process_virtual_memory_bytes,
// process_open_fds, process_max_fds, process_start_time_seconds (read from
// /proc at each scrape); what glibc's malloc holds live and free,
// downpour_malloc_in_use_bytes and downpour_malloc_free_bytes (mallinfo2 at
// each scrape); and downpour_build_info{daemon,version,commit} = 1.
//
// Thread-safe. The registry is not owned and must outlive nothing here (the
// collector keeps only copies).
#ifndef DOWNPOUR_COMMON_PROCESS_METRICS_H_
#define DOWNPOUR_COMMON_PROCESS_METRICS_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace downpour {

struct ProcessStats {
  double cpu_seconds = 0;  // User and system time.
  double resident_bytes = 0;
  double virtual_bytes = 0;
  double open_fds = 0;
  double max_fds = 0;             // The soft limit; +Inf when unlimited.
  double start_time_seconds = 0;  // Since the Unix epoch.
};

// The stats of process `pid` ("self" or a number) from the procfs mounted at
// `proc_root`: PID/stat, PID/limits, the entries of PID/fd, and the boot time
// in stat. An error names the file it could not read or parse.
absl::StatusOr<ProcessStats> ReadProcessStats(const std::string& proc_root = "/proc",
                                              const std::string& pid = "self");

// The memory process `pid` may use, in bytes: the limit of its cgroup
// (v2: memory.max of the cgroup PID/cgroup names under `cgroup_root`; v1:
// memory/memory.limit_in_bytes) where one is set, else the machine's
// (MemTotal in meminfo), whichever is smaller. An error names the file it
// could not read or parse (a missing cgroup file means no limit there).
absl::StatusOr<double> ReadMemoryLimit(const std::string& proc_root = "/proc",
                                       const std::string& cgroup_root = "/sys/fs/cgroup",
                                       const std::string& pid = "self");

// The cores process `pid` may keep busy: its cgroup's CPU quota where one
// is set (v2: the least cpu.max "QUOTA PERIOD" of the cgroup PID/cgroup
// names under `cgroup_root` and its ancestors; v1: cpu/cpu.cfs_quota_us
// over cpu.cfs_period_us of the hierarchy's root), rounded
// up, and at most `cores` (the CPUs it may run on). An unreadable or
// malformed file counts as no quota: this sizes thread pools, it is not a
// limit to enforce.
int ReadCpuLimit(int cores, const std::string& proc_root = "/proc",
                 const std::string& cgroup_root = "/sys/fs/cgroup",
                 const std::string& pid = "self");

// What this process's automatic thread counts are sized by: ReadCpuLimit of
// the CPUs its affinity allows (a container's CPU limit, taskset, a Slurm
// allocation), at least 1. Read once.
int UsableCores();

// What a daemon's memory budget is by default ("auto"): this share of what
// its process may use; the rest is the process's own.
inline constexpr double kAutoMemoryShare = 0.8;

// A daemon's memory budget flag (--memory_limit, --device_memory_limit):
// "auto" is `share` of what the process may use (ReadMemoryLimit), "0" no
// limit, else a number of bytes. InvalidArgument naming `flag` for anything
// else; an unreadable limit with "auto" means no limit.
absl::StatusOr<int64_t> ParseMemoryLimitFlag(const std::string& flag, const std::string& value,
                                             double share);

// Exports `name` (a gauge) as ReadMemoryLimit's, read at every exposition:
// the limit a daemon's memory alert compares its use with.
void AddMemoryLimit(MetricsRegistry* registry, const std::string& name, const std::string& help);

// Exports this process's process_* metrics, read afresh at every exposition
// (a failed read keeps the last values).
void AddProcessMetrics(MetricsRegistry* registry);

// Exports downpour_build_info{daemon, version, commit} 1 (common/build_info.h);
// `daemon` is the binary's name ("downpour-ps").
void AddBuildInfo(MetricsRegistry* registry, const std::string& daemon);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_PROCESS_METRICS_H_
