// doctor's rules about how the GPUs are connected, on GPU states built by hand: a PCIe link
// narrower or slower than it can be, NVLink error counters, the NVSwitch fabric manager.
#include <gtest/gtest.h>

#include "tools/doctor/doctor_checks.h"

namespace lockstep::tools {
namespace {

using gpu::FabricState;
using gpu::GpuDevice;
using gpu::NvlinkErrors;

// An H100 SXM in a Gen5 x16 slot, idle (its link down at Gen1), 18 clean NVLinks to NVSwitches.
GpuDevice h100(unsigned index) {
  GpuDevice d;
  d.index = index;
  d.name = "NVIDIA H100 80GB HBM3";
  d.pcie_generation = 1;
  d.pcie_generation_max = d.pcie_generation_gpu_max = 5;
  d.pcie_width = d.pcie_width_max = 16;
  d.nvlink_errors = NvlinkErrors{18, 0, 0, 0, 0};
  d.behind_nvswitch = true;
  d.fabric_state = FabricState::kCompleted;
  return d;
}

DoctorInput hgx(unsigned n) {
  DoctorInput in;
  in.gpus.driver_version = "550.54.15";
  for (unsigned i = 0; i < n; ++i) in.gpus.devices.push_back(h100(i));
  return in;
}

TEST(DoctorLinkChecks, AFullWidthLinkPassesThoughAnIdleGpuSlowedIt) {
  const Check c = check_pcie_link(hgx(4));
  EXPECT_EQ(c.status, Status::kPass) << c.summary;
  ASSERT_EQ(c.details.size(), 4u);
  EXPECT_NE(c.details[0].find("x16 Gen5 at most (Gen1 now: an idle GPU slows its link)"), std::string::npos)
      << c.details[0];
}

TEST(DoctorLinkChecks, ALinkTrainedDownOrCappedBySlotWarnsNamingTheGpu) {
  DoctorInput in = hgx(4);
  in.gpus.devices[1].pcie_width = 8;
  in.gpus.devices[3].pcie_generation_max = 3;  // a Gen3 slot under a Gen5 GPU
  const Check c = check_pcie_link(in);
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_NE(c.summary.find("GPU 1 (x8 of x16 lanes)"), std::string::npos) << c.summary;
  EXPECT_NE(c.summary.find("GPU 3 (capped at Gen3 by its slot, of the GPU's Gen5)"), std::string::npos) << c.summary;
  EXPECT_EQ(c.summary.find("GPU 0"), std::string::npos) << c.summary;
  EXPECT_NE(c.fix.find("x16"), std::string::npos);
}

TEST(DoctorLinkChecks, NoPcieReadingIsUnknownNotAPass) {
  DoctorInput in = hgx(2);
  for (GpuDevice& d : in.gpus.devices) d.pcie_width.reset();
  const Check c = check_pcie_link(in);
  EXPECT_EQ(c.status, Status::kInfo);
  EXPECT_EQ(c.summary.rfind("unknown", 0), 0u) << c.summary;
}

TEST(DoctorLinkChecks, CleanNvlinksPassAndCountedErrorsWarnWithTheirCounts) {
  DoctorInput in = hgx(4);
  Check c = check_nvlink_errors(in);
  EXPECT_EQ(c.status, Status::kPass);
  EXPECT_NE(c.summary.find("72 active links of 4 GPUs"), std::string::npos) << c.summary;

  in.gpus.devices[2].nvlink_errors = NvlinkErrors{18, 214, 1, 5120, 37};
  c = check_nvlink_errors(in);
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_NE(c.summary.find("GPU 2"), std::string::npos) << c.summary;
  ASSERT_EQ(c.details.size(), 1u);
  EXPECT_EQ(c.details[0],
            "GPU 2: 214 replays, 1 recovery, 5120 CRC flit errors, 37 CRC data errors on its 18 links since the "
            "driver loaded");
}

TEST(DoctorLinkChecks, WithoutNvlinkTheNvlinkRuleIsInformation) {
  DoctorInput in = hgx(2);
  for (GpuDevice& d : in.gpus.devices) d.nvlink_errors.reset();
  EXPECT_EQ(check_nvlink_errors(in).status, Status::kInfo);
}

TEST(DoctorLinkChecks, AGpuTheFabricManagerHasNotRegisteredFailsWithCudaError802) {
  DoctorInput in = hgx(4);
  EXPECT_EQ(check_fabric_manager(in).status, Status::kPass);
  in.gpus.devices[3].fabric_state = FabricState::kInProgress;
  in.gpus.devices[1].fabric_error = "Unknown Error";
  const Check c = check_fabric_manager(in);
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_NE(c.summary.find("GPU 1 (failed: Unknown Error), GPU 3 (in progress)"), std::string::npos) << c.summary;
  EXPECT_NE(c.summary.find("802"), std::string::npos);
  EXPECT_NE(c.fix.find("nvidia-fabricmanager"), std::string::npos);
  EXPECT_NE(c.fix.find("550.54.15"), std::string::npos);
}

// An A100 NVSwitch system reports no registration: the daemon's process is what shows.
TEST(DoctorLinkChecks, BeforeHopperTheFabricManagersProcessIsLookedFor) {
  DoctorInput in = hgx(8);
  for (GpuDevice& d : in.gpus.devices) d.fabric_state.reset();
  in.host.fabric_manager_running = false;
  EXPECT_EQ(check_fabric_manager(in).status, Status::kWarn);
  in.host.fabric_manager_running = true;
  EXPECT_EQ(check_fabric_manager(in).status, Status::kPass);
}

TEST(DoctorLinkChecks, APcieSystemNeedsNoFabricManager) {
  DoctorInput in = hgx(2);
  for (GpuDevice& d : in.gpus.devices) {
    d.behind_nvswitch = false;
    d.fabric_state.reset();
  }
  EXPECT_EQ(check_fabric_manager(in).status, Status::kInfo);
}

}  // namespace
}  // namespace lockstep::tools
