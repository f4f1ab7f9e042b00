#include "lockstep/gpu/gpu_state.h"

#include <gtest/gtest.h>
#include <pwd.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "lockstep/gpu/process_details.h"

namespace lockstep::gpu {
namespace {

TEST(NvmlThrottleNames, NamesEachBitInBitOrder) {
  EXPECT_EQ(throttle_reason_names(0), "none");
  EXPECT_EQ(throttle_reason_names(0x1), "gpu_idle");
  EXPECT_EQ(throttle_reason_names(0x44), "sw_power_cap,hw_thermal_slowdown");
  EXPECT_EQ(throttle_reason_names(0x1ff),
            "gpu_idle,applications_clocks_setting,sw_power_cap,hw_slowdown,sync_boost,sw_thermal_slowdown,"
            "hw_thermal_slowdown,hw_power_brake_slowdown,display_clock_setting");
  EXPECT_EQ(throttle_reason_names(0x4 | 0x1000), "sw_power_cap,0x1000");  // a bit from a newer driver
}

TEST(NvmlThrottleNames, ThermalAndPowerClasses) {
  EXPECT_TRUE(is_thermal_throttle(0x20));
  EXPECT_TRUE(is_thermal_throttle(0x40));
  EXPECT_FALSE(is_thermal_throttle(0x4 | 0x1));
  EXPECT_TRUE(is_power_throttle(0x4));
  EXPECT_TRUE(is_power_throttle(0x8));
  EXPECT_TRUE(is_power_throttle(0x80));
  EXPECT_FALSE(is_power_throttle(0x40 | 0x1));
}

TEST(NvmlGpuPath, PrintsAsNvidiaSmiTopo) {
  EXPECT_EQ(to_string(GpuPath{GpuLink::kSelf, 0}), "X");
  EXPECT_EQ(to_string(GpuPath{GpuLink::kNvlink, 12}), "NV12");
  EXPECT_EQ(to_string(GpuPath{GpuLink::kPix, 0}), "PIX");
  EXPECT_EQ(to_string(GpuPath{GpuLink::kPxb, 0}), "PXB");
  EXPECT_EQ(to_string(GpuPath{GpuLink::kPhb, 0}), "PHB");
  EXPECT_EQ(to_string(GpuPath{GpuLink::kNode, 0}), "NODE");
  EXPECT_EQ(to_string(GpuPath{GpuLink::kSys, 0}), "SYS");
}

TEST(NvmlProcessDetails, ReadsOwnerAndCommandFromProc) {
  const std::filesystem::path root = ::testing::TempDir() + "/proc-" + std::to_string(getpid());
  std::filesystem::create_directories(root / "4242");
  std::ofstream(root / "4242" / "status") << "Name:\tpython3\nUmask:\t0022\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n";
  std::ofstream(root / "4242" / "cmdline", std::ios::binary) << std::string("python3\0train.py\0--lr\0003e-4\0", 27);

  GpuProcess process;
  process.pid = 4242;
  fill_process_details(process, root.string());
  EXPECT_TRUE(process.in_this_namespace);
  EXPECT_EQ(process.uid, 0u);
  if (const passwd* entry = getpwuid(0)) {
    EXPECT_EQ(process.user, entry->pw_name);
  }
  EXPECT_EQ(process.command, "python3 train.py --lr 3e-4");

  GpuProcess elsewhere;
  elsewhere.pid = 4343;  // not under root: a host PID from outside this namespace
  fill_process_details(elsewhere, root.string());
  EXPECT_FALSE(elsewhere.in_this_namespace);
  EXPECT_TRUE(elsewhere.command.empty());
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace lockstep::gpu
