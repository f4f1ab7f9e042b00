// Plain lines and the full-screen frame from hand-built samples.
#include "tools/top/top_lines.h"

#include <gtest/gtest.h>

#include "tools/top/top_testing.h"
#include "tools/top/top_view.h"

namespace lockstep::tools {
namespace {

using top_testing::two_gpu_sample;

TEST(TopLines, DeviceRowShowsEachReadingInItsColumn) {
  const TopSample sample = two_gpu_sample();
  // Columns: GPU, CUDA, NAME (24), UTIL, MEMUTIL, MEMORY, TEMP, POWER, SM CLOCK, THROTTLE.
  const std::string expected = std::string("  0") + " " + "   1" + " " + "NVIDIA A100-SXM4-80GB   " + " " + " 97%" +
                               " " + "    45%" + " " + "  71234 / 81920 MiB" + " " + "  64C" + " " + "  312 / 400 W" +
                               " " + " 1410 MHz" + "  " + "none";
  EXPECT_EQ(device_row(sample.gpus.devices[0], 1), expected);
  EXPECT_EQ(device_header().find("GPU CUDA NAME"), 0u) << device_header();
}

TEST(TopLines, MissingReadingsShowAsDashes) {
  gpu::GpuDevice device = two_gpu_sample().gpus.devices[0];
  device.utilization_gpu.reset();
  device.power_mw.reset();
  device.throttle_reasons.reset();
  const std::string row = device_row(device, std::nullopt);
  EXPECT_NE(row.find("  0    - NVIDIA"), std::string::npos) << row;
  EXPECT_NE(row.find("   - "), std::string::npos) << row;
  EXPECT_NE(row.find("- / 400 W"), std::string::npos) << row;
  EXPECT_EQ(row.substr(row.size() - 3), "  -") << row;
}

TEST(TopLines, ProcessRowsNameUserAndCommandAndSayWhenAProcessIsInvisible) {
  const auto rows = process_rows(two_gpu_sample().gpus.devices[1]);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0], "         pid 12346     69000 MiB  alice  python train.py");
  EXPECT_EQ(rows[1], "         pid 4242       1000 MiB  (another PID namespace: user and command unknown here)");
}

TEST(TopLines, AProcessWithAUtilizationSampleShowsItsShareOfTheGpu) {
  gpu::GpuDevice device = two_gpu_sample().gpus.devices[0];
  device.processes[0].sm_utilization = 93;
  device.processes[0].memory_utilization = 40;
  const auto rows = process_rows(device);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0], "         pid 12345     70000 MiB  SM  93%  mem  40%  alice  python train.py");
}

TEST(TopLines, PlainBlockHasEveryDeviceProcessAndAlertAndNoEscapes) {
  TopSample sample = two_gpu_sample();
  sample.order_warning = "CUDA numbers these GPUs differently from NVML: NVML 0 is CUDA 1";
  sample.alerts = {{"memory", {1}, "GPU 1 memory 96.0% full"}};
  const std::string block = plain_block(sample);
  EXPECT_EQ(block.find('\x1b'), std::string::npos);
  EXPECT_NE(block.find("driver 535.129.03  CUDA 12.2  NVML /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\n"),
            std::string::npos)
      << block;
  EXPECT_NE(block.find("\nWARNING CUDA numbers these GPUs differently"), std::string::npos) << block;
  EXPECT_NE(block.find("\n  0    1 NVIDIA"), std::string::npos) << block;
  EXPECT_NE(block.find("\n  1    0 NVIDIA"), std::string::npos) << block;
  EXPECT_NE(block.find("pid 12345"), std::string::npos) << block;
  EXPECT_NE(block.find("pid 4242"), std::string::npos) << block;
  EXPECT_EQ(block.substr(block.size() - 30), "ALERT GPU 1 memory 96.0% full\n") << block;
  EXPECT_EQ(block.find("leased by"), std::string::npos) << block;
  // A GPU a lockstep run job leases shows its holder under it.
  sample.leases[1] = "pid 4242 (user ana): lockstep run -n 1 -- train.py";
  const std::string leased = plain_block(sample);
  const size_t gpu1 = leased.find("\n  1    0 NVIDIA");
  ASSERT_NE(gpu1, std::string::npos) << leased;
  EXPECT_EQ(leased.find("leased by pid 4242 (user ana): lockstep run -n 1 -- train.py"),
            leased.find('\n', gpu1 + 1) + 1 + 9)
      << leased;
}

TEST(TopLines, CpuBlockSaysWhyAndListsCoresAndMemory) {
  const std::string block = plain_block(top_testing::cpu_sample());
  EXPECT_NE(block.find("no NVIDIA driver found (/nonexistent/libnvidia-ml.so.1: cannot open shared object file"),
            std::string::npos)
      << block;
  EXPECT_NE(block.find("\ncpu0    12.5%\n"), std::string::npos) << block;
  EXPECT_NE(block.find("\ncpu1   100.0%\n"), std::string::npos) << block;
  EXPECT_NE(block.find("\nmemory 12288 / 16384 MiB (75.0%)\n"), std::string::npos) << block;
}

TEST(TopLines, UtcTimestampHasMilliseconds) {
  EXPECT_EQ(utc_timestamp(two_gpu_sample().taken), "2024-05-01T12:00:00.123Z");
}

TEST(TopView, ScreenHasASparklineRowUnderEachGpuAndFitsTheWidth) {
  const TopSample sample = two_gpu_sample();
  History history;
  TopSample low = sample;
  low.gpus.devices[0].utilization_gpu = 0;
  history.add(low);
  history.add(sample);
  const auto lines = screen_lines(sample, history, 100, 40);
  // title, header, then per GPU: row, sparklines, processes.
  ASSERT_GE(lines.size(), 8u);
  EXPECT_EQ(lines[1].find("GPU CUDA NAME"), 0u);
  EXPECT_EQ(lines[2].find("  0    1 NVIDIA"), 0u);
  // (100 - 21) / 2 = 39 columns each; GPU 0 went 0% -> 97%.
  const std::string util0 = "         util " + std::string(37, ' ') + "▁█";
  EXPECT_EQ(lines[3].substr(0, util0.size()), util0) << lines[3];
  EXPECT_NE(lines[3].find("  mem "), std::string::npos);
  EXPECT_EQ(lines[4].find("         pid 12345"), 0u);
  EXPECT_EQ(lines[5].find("  1    0 NVIDIA"), 0u);
  for (const std::string& line : screen_lines(sample, history, 50, 40)) EXPECT_LE(line.size(), 50u * 3) << line;
  EXPECT_EQ(fit_columns("ab▁▂▃cd", 4), "ab▁▂");
  EXPECT_EQ(fit_columns("abc", 10), "abc");
}

TEST(TopView, ACutScreenKeepsItsAlerts) {
  TopSample sample = two_gpu_sample();
  sample.alerts = {{"thermal", {0}, "GPU 0 thermal throttling"}};
  const auto lines = screen_lines(sample, History(), 120, 5);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines.back(), "ALERT GPU 0 thermal throttling");
}

TEST(TopView, FrameOverwritesInPlaceInsteadOfClearing) {
  const std::string bytes = frame_bytes({"one", "two"});
  EXPECT_EQ(bytes, "\x1b[Hone\x1b[K\r\ntwo\x1b[K\x1b[J");
  EXPECT_EQ(bytes.find("\x1b[2J"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::tools
