// The xid and iommu-acs rules on HostFacts built by hand: each status they can give, and the
// GPU, Xid and bridge each finding names.
#include <gtest/gtest.h>

#include "tools/doctor/doctor_checks.h"

namespace lockstep::tools {
namespace {

// A host with two GPUs in the driver's list and nothing read from the kernel log or PCI.
DoctorInput gpu_host() {
  DoctorInput in;
  in.host.driver_gpus = {{"0000:07:00.0", "NVIDIA H100 80GB HBM3"}, {"0000:0f:00.0", "NVIDIA H100 80GB HBM3"}};
  in.host.device_nodes = {"/dev/nvidia0", "/dev/nvidia1"};
  return in;
}

gpu::XidEvent xid(const std::string& bus_id, int number, const std::string& message = "pid=1, name=python") {
  return {bus_id, number, message};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(DoctorHostXid, AnUnreadableKernelLogIsUnknownNeverPass) {
  const Check c = check_xid(gpu_host());
  EXPECT_EQ(c.name, "xid");
  EXPECT_EQ(c.status, Status::kInfo);
  EXPECT_TRUE(contains(c.summary, "unknown")) << c.summary;
  EXPECT_TRUE(contains(c.summary, "CAP_SYSLOG")) << c.summary;
}

TEST(DoctorHostXid, AReadLogWithoutXidsPasses) {
  DoctorInput in = gpu_host();
  in.host.kernel_log_read = true;
  const Check c = check_xid(in);
  EXPECT_EQ(c.status, Status::kPass);
  EXPECT_EQ(c.summary, "no Xid errors in the kernel log since boot");
}

TEST(DoctorHostXid, ASeriousXidFailsNamingTheGpuTheXidItsCountAndMeaning) {
  DoctorInput in = gpu_host();
  in.host.kernel_log_read = true;
  in.host.xid_events = {xid("0000:07:00.0", 79, "pid=1234, name=python, GPU has fallen off the bus."),
                        xid("0000:07:00.0", 79), xid("0000:07:00.0", 79), xid("0000:0f:00.0", 13)};
  const Check c = check_xid(in);
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_TRUE(contains(c.summary, "Xid 79 on GPU 0000:07:00.0 (3 times): GPU has fallen off the bus")) << c.summary;
  EXPECT_FALSE(contains(c.summary, "Xid 13")) << "the program's Xid stays in the details: " << c.summary;
  EXPECT_TRUE(contains(c.fix, "drain the node")) << c.fix;
  EXPECT_TRUE(contains(c.fix, "nvidia-smi -r -i 0000:07:00.0")) << c.fix;
  EXPECT_TRUE(contains(c.fix, "RMA")) << c.fix;
  ASSERT_EQ(c.details.size(), 2u);
  EXPECT_TRUE(contains(c.details[0], "Xid 79")) << c.details[0];
  EXPECT_TRUE(contains(c.details[0], "; latest: pid=1, name=python")) << c.details[0];
  EXPECT_TRUE(contains(c.details[1], "Xid 13 on GPU 0000:0f:00.0 (1 time)")) << c.details[1];
}

TEST(DoctorHostXid, EachSeriousXidFails) {
  for (int number : {48, 63, 64, 74, 79, 92, 94, 95, 119, 120}) {
    DoctorInput in = gpu_host();
    in.host.kernel_log_read = true;
    in.host.xid_events = {xid("0000:0f:00.0", number)};
    const Check c = check_xid(in);
    EXPECT_EQ(c.status, Status::kFail) << number;
    EXPECT_TRUE(contains(c.summary, "Xid " + std::to_string(number) + " on GPU 0000:0f:00.0")) << c.summary;
  }
}

TEST(DoctorHostXid, SeveralGpusGetAGenericCommand) {
  DoctorInput in = gpu_host();
  in.host.kernel_log_read = true;
  in.host.xid_events = {xid("0000:07:00.0", 48), xid("0000:0f:00.0", 95)};
  const Check c = check_xid(in);
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_TRUE(contains(c.summary, "Xid 48 on GPU 0000:07:00.0")) << c.summary;
  EXPECT_TRUE(contains(c.summary, "Xid 95 on GPU 0000:0f:00.0")) << c.summary;
  EXPECT_TRUE(contains(c.fix, "nvidia-smi -r -i <bus id>")) << c.fix;
}

TEST(DoctorHostXid, ApplicationXidsWarnAsAProgramsFault) {
  for (int number : {13, 31, 43, 45}) {
    DoctorInput in = gpu_host();
    in.host.kernel_log_read = true;
    in.host.xid_events = {xid("0000:0f:00.0", number), xid("0000:0f:00.0", number)};
    const Check c = check_xid(in);
    EXPECT_EQ(c.status, Status::kWarn) << number;
    EXPECT_TRUE(contains(c.summary, "Xid " + std::to_string(number) + " on GPU 0000:0f:00.0 (2 times)")) << c.summary;
    EXPECT_TRUE(contains(c.summary, "program's fault")) << c.summary;
    EXPECT_FALSE(c.fix.empty());
  }
}

TEST(DoctorHostXid, AnXidTheTableDoesNotKnowWarnsAndPointsAtTheCatalog) {
  DoctorInput in = gpu_host();
  in.host.kernel_log_read = true;
  in.host.xid_events = {xid("0000:07:00.0", 9999)};
  const Check c = check_xid(in);
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_TRUE(contains(c.summary, "Xid catalog")) << c.summary;
  EXPECT_FALSE(contains(c.summary, "program's fault")) << "nothing says whose fault it is: " << c.summary;
}

// A GPU host whose kernel command line and PCI bridges were read and show nothing wrong.
DoctorInput clean_iommu_host() {
  DoctorInput in = gpu_host();
  in.host.kernel_cmdline_read = true;
  in.host.pci_bridges = 6;
  return in;
}

TEST(DoctorHostIommu, AHostWithoutGpusSkipsIt) {
  DoctorInput in;
  in.host.kernel_cmdline_read = true;
  in.host.iommu_present = true;
  in.host.acs_redirecting_bridges = {{"0000:00:01.0", 0x001d}};
  const Check c = check_iommu_acs(in);
  EXPECT_EQ(c.name, "iommu-acs");
  EXPECT_EQ(c.status, Status::kInfo);
  EXPECT_TRUE(contains(c.summary, "no NVIDIA GPU")) << c.summary;
}

TEST(DoctorHostIommu, NvmlsGpusAloneCountAsGpus) {
  DoctorInput in;
  in.gpus.devices.resize(1);
  in.host.kernel_cmdline_read = true;
  in.host.iommu_present = true;
  EXPECT_EQ(check_iommu_acs(in).status, Status::kWarn);
}

TEST(DoctorHostIommu, NoIommuAndNoAcsPasses) {
  const Check c = check_iommu_acs(clean_iommu_host());
  EXPECT_EQ(c.status, Status::kPass);
  EXPECT_TRUE(contains(c.summary, "the IOMMU is off")) << c.summary;
  EXPECT_TRUE(contains(c.summary, "6 bridges checked")) << c.summary;
}

TEST(DoctorHostIommu, PassthroughPasses) {
  DoctorInput in = clean_iommu_host();
  in.host.iommu_present = true;
  in.host.iommu_cmdline = {"intel_iommu=on", "iommu=pt"};
  Check c = check_iommu_acs(in);
  EXPECT_EQ(c.status, Status::kPass) << c.summary;
  EXPECT_TRUE(contains(c.summary, "passes DMA through (kernel command line: intel_iommu=on iommu=pt)")) << c.summary;

  in.host.iommu_cmdline = {"iommu.passthrough=1"};
  EXPECT_EQ(check_iommu_acs(in).status, Status::kPass);

  // A kernel built to pass through by default says so in its groups' types.
  in.host.iommu_cmdline.clear();
  in.host.iommu_domain_types = {"identity"};
  EXPECT_EQ(check_iommu_acs(in).status, Status::kPass);
}

TEST(DoctorHostIommu, ATranslatingIommuWarnsWithTheKernelCommandLineFix) {
  DoctorInput in = clean_iommu_host();
  in.host.iommu_present = true;
  in.host.iommu_cmdline = {"intel_iommu=on"};
  Check c = check_iommu_acs(in);
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_TRUE(contains(c.summary, "the IOMMU translates DMA addresses (kernel command line: intel_iommu=on)"))
      << c.summary;
  EXPECT_TRUE(contains(c.summary, "NCCL hangs")) << c.summary;
  EXPECT_TRUE(contains(c.fix, "iommu=pt")) << c.fix;

  // On by default (AMD's IOMMU is, and kernels built with it on): no word on the command line.
  in.host.iommu_cmdline.clear();
  c = check_iommu_acs(in);
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_TRUE(contains(c.summary, "no IOMMU setting on the kernel command line")) << c.summary;

  // The groups' types win over the command line: iommu=pt asked for, DMA in effect.
  in.host.iommu_cmdline = {"iommu=pt"};
  in.host.iommu_domain_types = {"DMA-FQ", "identity"};
  EXPECT_EQ(check_iommu_acs(in).status, Status::kWarn);
}

TEST(DoctorHostIommu, BridgesWithAcsRedirectWarnWithASetpciLinePerBridge) {
  DoctorInput in = clean_iommu_host();
  in.host.acs_redirecting_bridges = {{"0000:00:01.0", 0x001d}, {"0000:05:00.0", 0x0020}};
  const Check c = check_iommu_acs(in);
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_TRUE(contains(c.summary, "2 PCI bridges (0000:00:01.0, 0000:05:00.0)")) << c.summary;
  EXPECT_TRUE(contains(c.fix, "setpci -s <bdf> ECAP_ACS+0x6.w=0000")) << c.fix;
  EXPECT_TRUE(contains(c.fix, "BIOS")) << c.fix;
  ASSERT_EQ(c.details.size(), 2u);
  EXPECT_EQ(c.details[0],
            "bridge 0000:00:01.0: ACS Control 0x001d (request redirect, completion redirect): sudo setpci -s "
            "0000:00:01.0 ECAP_ACS+0x6.w=0000");
  EXPECT_TRUE(contains(c.details[1], "(egress control)")) << c.details[1];
}

TEST(DoctorHostIommu, BothFindingsWarnTogether) {
  DoctorInput in = clean_iommu_host();
  in.host.iommu_present = true;
  in.host.acs_redirecting_bridges = {{"0000:00:01.0", 0x0004}};
  const Check c = check_iommu_acs(in);
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_TRUE(contains(c.summary, "IOMMU translates")) << c.summary;
  EXPECT_TRUE(contains(c.summary, "1 PCI bridge (0000:00:01.0)")) << c.summary;
  EXPECT_TRUE(contains(c.fix, "iommu=pt") && contains(c.fix, "setpci")) << c.fix;
}

TEST(DoctorHostIommu, WhatCouldNotBeReadIsInfo) {
  DoctorInput in = gpu_host();  // neither the command line nor any bridge was read
  Check c = check_iommu_acs(in);
  EXPECT_EQ(c.status, Status::kInfo);
  EXPECT_TRUE(contains(c.summary, "unknown: the IOMMU mode")) << c.summary;

  in = clean_iommu_host();
  in.host.pci_bridges_unreadable = 6;
  c = check_iommu_acs(in);
  EXPECT_EQ(c.status, Status::kInfo);
  EXPECT_TRUE(contains(c.summary, "the IOMMU is off; unknown: the ACS setting of 6 of 6 PCI bridges")) << c.summary;
  EXPECT_TRUE(contains(c.summary, "needs root")) << c.summary;
}

TEST(DoctorHostIommu, RunChecksListsBothRules) {
  DoctorInput in = clean_iommu_host();
  in.host.kernel_log_read = true;
  int seen = 0;
  for (const Check& c : run_checks(in)) seen += c.name == "xid" || c.name == "iommu-acs";
  EXPECT_EQ(seen, 2);
}

}  // namespace
}  // namespace lockstep::tools
