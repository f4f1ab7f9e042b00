// /proc/stat deltas and /proc/meminfo as top's CPU view reads them, from fixture text.
#include <gtest/gtest.h>
#include <unistd.h>

#include "tools/top/cpu_usage.h"

namespace lockstep::tools {
namespace {

// user nice system idle iowait irq softirq steal guest guest_nice
const char* kBefore =
    "cpu  300 0 150 1800 100 0 0 0 0 0\n"
    "cpu0 100 0 50 800 50 0 0 0 0 0\n"
    "cpu1 200 0 100 1000 50 0 0 0 0 0\n"
    "intr 12345 0 0\n"
    "ctxt 999\n";
const char* kAfter =
    "cpu  700 0 250 2200 150 0 0 0 0 0\n"
    "cpu0 200 0 100 1000 100 0 0 0 30 0\n"
    "cpu1 500 10 150 1200 50 20 10 10 0 0\n"
    "intr 12345 0 0\n";

TEST(TopCpuUsage, ParsesPerCoreLinesAndSkipsTheTotal) {
  const auto cores = parse_proc_stat(kBefore);
  ASSERT_EQ(cores.size(), 2u);
  EXPECT_EQ(cores[0].busy, 150u);
  EXPECT_EQ(cores[0].total, 1000u);
  EXPECT_EQ(cores[1].busy, 300u);
  EXPECT_EQ(cores[1].total, 1350u);
}

TEST(TopCpuUsage, UtilizationIsBusyTicksOverAllTicksBetweenReadings) {
  const auto percent = core_utilization(parse_proc_stat(kBefore), parse_proc_stat(kAfter));
  ASSERT_EQ(percent.size(), 2u);
  // cpu0: busy 150 -> 300, total 1000 -> 1400; guest (30) is already inside user.
  EXPECT_DOUBLE_EQ(percent[0], 100.0 * 150 / 400);
  // cpu1: busy 300 -> 700 (user +300, nice +10, system +50, irq, softirq, steal +40), idle +200.
  EXPECT_DOUBLE_EQ(percent[1], 100.0 * 400 / 600);
}

TEST(TopCpuUsage, ACoreWithNoTicksOrRestartedCountersReadsZero) {
  const auto same = core_utilization(parse_proc_stat(kBefore), parse_proc_stat(kBefore));
  EXPECT_EQ(same, std::vector<double>({0.0, 0.0}));
  const auto backwards = core_utilization(parse_proc_stat(kAfter), parse_proc_stat(kBefore));
  EXPECT_EQ(backwards, std::vector<double>({0.0, 0.0}));
}

TEST(TopCpuUsage, OldKernelsWithFewerColumnsParse) {
  const auto cores = parse_proc_stat("cpu0 10 0 5 85\n");
  ASSERT_EQ(cores.size(), 1u);
  EXPECT_EQ(cores[0].busy, 15u);
  EXPECT_EQ(cores[0].total, 100u);
}

TEST(TopCpuUsage, MemoryUsedIsTotalLessAvailable) {
  const HostMemory memory = parse_meminfo(
      "MemTotal:       16384 kB\n"
      "MemFree:         1024 kB\n"
      "MemAvailable:    4096 kB\n"
      "Buffers:          100 kB\n");
  EXPECT_EQ(memory.total, 16384u * 1024);
  EXPECT_EQ(memory.available, 4096u * 1024);
  EXPECT_EQ(memory.used(), 12288u * 1024);
}

TEST(TopCpuUsage, ReaderGivesOneValueInRangePerCore) {
  CpuReader reader;
  const CpuSample sample = reader.read();
  // /proc/stat lists the online cores.
  EXPECT_EQ(sample.core_utilization.size(), static_cast<size_t>(sysconf(_SC_NPROCESSORS_ONLN)));
  ASSERT_FALSE(sample.core_utilization.empty());
  for (double p : sample.core_utilization) {
    EXPECT_GE(p, 0.0);
    EXPECT_LE(p, 100.0);
  }
  EXPECT_GT(sample.memory.total, 0u);
}

}  // namespace
}  // namespace lockstep::tools
