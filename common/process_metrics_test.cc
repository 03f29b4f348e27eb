#include "common/process_metrics.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

// A procfs of one process, 4242, written under the test's temp directory.
class FakeProc {
 public:
  explicit FakeProc(const std::string& name)
      : root_(absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name)) {
    mkdir(root_.c_str(), 0755);
    mkdir((root_ + "/4242").c_str(), 0755);
    mkdir((root_ + "/4242/fd").c_str(), 0755);
  }
  void Write(const std::string& path, const std::string& text) {
    std::ofstream(root_ + "/" + path) << text;
  }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

// Fields 3.. of PID/stat with utime (14), stime (15), starttime (22), vsize
// (23) and rss (24) set.
std::string StatLine(const std::string& comm) {
  const std::map<int, std::string> set = {
      {14, "250"}, {15, "150"}, {22, "1000"}, {23, "1048576"}, {24, "100"}};
  std::string out = absl::StrCat("4242 (", comm, ") S");
  for (int field = 4; field <= 52; ++field) {
    auto it = set.find(field);
    absl::StrAppend(&out, " ", it == set.end() ? "0" : it->second);
  }
  return out + "\n";
}

// A cgroup (v2 here, v1 below) whose quota is 1.5 CPUs of a 16-core machine:
// 2 cores' worth of threads; no quota, a malformed file or a quota above the
// cores: the cores.
TEST(CpuLimitTest, TheCgroupsQuotaRoundedUpAndAtMostTheCores) {
  FakeProc proc("cpu_cgroup");
  proc.Write("4242/cgroup", "0::/kubepods/pod1\n");
  const std::string cgroup = proc.root() + "/cgroup";
  for (const std::string dir : {"", "/kubepods", "/kubepods/pod1"}) {
    mkdir((cgroup + dir).c_str(), 0755);
  }
  const std::string cpu_max = cgroup + "/kubepods/pod1/cpu.max";
  EXPECT_EQ(ReadCpuLimit(16, proc.root(), cgroup, "4242"), 16);  // No file.
  std::ofstream(cpu_max) << "150000 100000\n";
  EXPECT_EQ(ReadCpuLimit(16, proc.root(), cgroup, "4242"), 2);
  std::ofstream(cpu_max) << "max 100000\n";
  EXPECT_EQ(ReadCpuLimit(16, proc.root(), cgroup, "4242"), 16);
  std::ofstream(cpu_max) << "3200000 100000\n";
  EXPECT_EQ(ReadCpuLimit(16, proc.root(), cgroup, "4242"), 16);
  std::ofstream(cpu_max) << "half\n";
  EXPECT_EQ(ReadCpuLimit(16, proc.root(), cgroup, "4242"), 16);
  // A parent's quota bounds the group under it.
  std::ofstream(cgroup + "/kubepods/cpu.max") << "400000 100000\n";
  EXPECT_EQ(ReadCpuLimit(16, proc.root(), cgroup, "4242"), 4);
  EXPECT_EQ(ReadCpuLimit(0, proc.root(), cgroup, "4242"), 1);

  FakeProc v1("cpu_cgroup_v1");
  const std::string root = v1.root() + "/cgroup";
  mkdir(root.c_str(), 0755);
  mkdir((root + "/cpu").c_str(), 0755);
  std::ofstream(root + "/cpu/cpu.cfs_quota_us") << "50000\n";
  std::ofstream(root + "/cpu/cpu.cfs_period_us") << "100000\n";
  EXPECT_EQ(ReadCpuLimit(8, v1.root(), root, "4242"), 1);
  std::ofstream(root + "/cpu/cpu.cfs_quota_us") << "-1\n";
  EXPECT_EQ(ReadCpuLimit(8, v1.root(), root, "4242"), 8);
}

TEST(MemoryLimitTest, MachineMemoryWithoutACgroupLimit) {
  FakeProc proc("mem_machine");
  proc.Write("meminfo", "MemTotal:       16384 kB\nMemFree:         1024 kB\n");
  proc.Write("4242/cgroup", "0::/\n");
  const std::string cgroup = proc.root() + "/cgroup";
  mkdir(cgroup.c_str(), 0755);
  std::ofstream(cgroup + "/memory.max") << "max\n";
  absl::StatusOr<double> limit = ReadMemoryLimit(proc.root(), cgroup, "4242");
  ASSERT_TRUE(limit.ok()) << limit.status();
  EXPECT_EQ(*limit, 16384.0 * 1024);
}

TEST(MemoryLimitTest, TheProcessesCgroupLimitWhenSmaller) {
  FakeProc proc("mem_cgroup");
  proc.Write("meminfo", "MemTotal:       16384 kB\n");
  proc.Write("4242/cgroup", "0::/system.slice/downpour-ps.service\n");
  const std::string cgroup = proc.root() + "/cgroup";
  mkdir(cgroup.c_str(), 0755);
  mkdir((cgroup + "/system.slice").c_str(), 0755);
  mkdir((cgroup + "/system.slice/downpour-ps.service").c_str(), 0755);
  std::ofstream(cgroup + "/system.slice/downpour-ps.service/memory.max") << "4194304\n";
  absl::StatusOr<double> limit = ReadMemoryLimit(proc.root(), cgroup, "4242");
  ASSERT_TRUE(limit.ok()) << limit.status();
  EXPECT_EQ(*limit, 4194304.0);
}

TEST(MemoryLimitTest, MissingOrBadFilesAreErrorsNamingThem) {
  FakeProc proc("mem_bad");
  absl::StatusOr<double> missing = ReadMemoryLimit(proc.root(), proc.root() + "/none", "4242");
  EXPECT_NE(missing.status().message().find("meminfo"), std::string::npos) << missing.status();
  proc.Write("meminfo", "MemTotal: lots\n");
  absl::StatusOr<double> bad = ReadMemoryLimit(proc.root(), proc.root() + "/none", "4242");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  // The real one, on this machine.
  absl::StatusOr<double> real = ReadMemoryLimit();
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_GT(*real, 0);
}

TEST(ProcessStatsTest, ReadsStatLimitsFdsAndBootTime) {
  FakeProc proc("proc_ok");
  proc.Write("4242/stat", StatLine("downpour-ps (x) y"));
  proc.Write("stat", "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n");
  proc.Write("4242/limits",
             "Limit                     Soft Limit           Hard Limit           Units\n"
             "Max open files            1024                 4096                 files\n");
  for (const char* fd : {"0", "1", "2"}) proc.Write(absl::StrCat("4242/fd/", fd), "");
  absl::StatusOr<ProcessStats> stats = ReadProcessStats(proc.root(), "4242");
  ASSERT_TRUE(stats.ok()) << stats.status();
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  EXPECT_DOUBLE_EQ(stats->cpu_seconds, 400 / ticks);
  EXPECT_DOUBLE_EQ(stats->start_time_seconds, 1700000000 + 1000 / ticks);
  EXPECT_DOUBLE_EQ(stats->virtual_bytes, 1048576);
  EXPECT_DOUBLE_EQ(stats->resident_bytes, 100 * page);
  EXPECT_DOUBLE_EQ(stats->max_fds, 1024);
  EXPECT_DOUBLE_EQ(stats->open_fds, 3);
}

TEST(ProcessStatsTest, UnlimitedFilesIsInfinite) {
  FakeProc proc("proc_unlimited");
  proc.Write("4242/stat", StatLine("w"));
  proc.Write("stat", "btime 1\n");
  proc.Write("4242/limits", "Max open files            unlimited            unlimited files\n");
  absl::StatusOr<ProcessStats> stats = ReadProcessStats(proc.root(), "4242");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(std::isinf(stats->max_fds));
  EXPECT_EQ(stats->open_fds, 0);
}

TEST(ProcessStatsTest, AMissingOrMalformedFileIsNamed) {
  FakeProc proc("proc_bad");
  absl::StatusOr<ProcessStats> missing = ReadProcessStats(proc.root(), "4242");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("4242/stat"), std::string::npos) << missing.status();
  proc.Write("4242/stat", "4242 (short) S 1 2 3\n");
  absl::StatusOr<ProcessStats> malformed = ReadProcessStats(proc.root(), "4242");
  ASSERT_FALSE(malformed.ok());
  EXPECT_NE(malformed.status().message().find("cannot parse"), std::string::npos);
  proc.Write("4242/stat", StatLine("w"));
  proc.Write("stat", "cpu 1 2\n");
  absl::StatusOr<ProcessStats> no_btime = ReadProcessStats(proc.root(), "4242");
  ASSERT_FALSE(no_btime.ok());
  EXPECT_NE(no_btime.status().message().find("/stat"), std::string::npos);
}

TEST(ProcessStatsTest, ThisProcessFromTheRealProc) {
  absl::StatusOr<ProcessStats> stats = ReadProcessStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->resident_bytes, 0);
  EXPECT_GE(stats->virtual_bytes, stats->resident_bytes);
  EXPECT_GE(stats->open_fds, 3);  // stdin, stdout, stderr at least.
  EXPECT_GT(stats->max_fds, 0);
  EXPECT_GT(stats->start_time_seconds, 1e9);
  EXPECT_LE(stats->start_time_seconds, static_cast<double>(std::time(nullptr)) + 1);
}

TEST(ProcessMetricsTest, ExportsProcessSeriesAndBuildInfo) {
  MetricsRegistry registry;
  AddProcessMetrics(&registry);
  AddBuildInfo(&registry, "downpour-test");
  const std::string text = registry.Exposition();
  for (const char* type :
       {"# TYPE process_cpu_seconds_total counter", "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_virtual_memory_bytes gauge", "# TYPE process_open_fds gauge",
        "# TYPE process_max_fds gauge", "# TYPE process_start_time_seconds gauge",
        "# TYPE downpour_malloc_in_use_bytes gauge", "# TYPE downpour_malloc_free_bytes gauge"}) {
    EXPECT_NE(text.find(type), std::string::npos) << type << " in\n" << text;
  }
  EXPECT_NE(
      text.find(absl::StrCat("downpour_build_info{commit=\"", BuildCommit(),
                             "\",daemon=\"downpour-test\",version=\"", BuildVersion(), "\"} 1\n")),
      std::string::npos)
      << text;
  EXPECT_STRNE(BuildCommit(), "");
  // This test's own allocations, at least.
  EXPECT_GT(registry.GetGauge("downpour_malloc_in_use_bytes", "")->value(), 0);
}

}  // namespace
}  // namespace downpour
