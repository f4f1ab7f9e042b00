// HostFacts read from a fake /proc, /sys and /dev tree written here, so the parsing of the
// driver's files, NUMA cpulists, device nodes, the kernel log, the IOMMU settings and PCI
// config space is checked against known contents.
#include "tools/doctor/host_facts.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace lockstep::tools {
namespace {

namespace fs = std::filesystem;

class HostFactsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("lockstep-host-facts-" + std::to_string(getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(const std::string& path, const std::string& text) {
    const fs::path file = root_ / path;
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
  }
  fs::path root_;
};

TEST_F(HostFactsTest, ReadsTheDriversGpusNumaNodesAndDeviceNodes) {
  write("proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\n"
        "GCC version:  gcc version 12.2.0\n");
  write("proc/driver/nvidia/gpus/0000:07:00.0/information",
        "Model: \t\t NVIDIA A100-SXM4-80GB\nIRQ:   \t\t 97\nBus Location: \t 0000:07:00.0\nDevice Minor: \t 0\n");
  write("proc/driver/nvidia/gpus/0000:0F:00.0/information", "Model: \t\t NVIDIA A100-SXM4-80GB\n");
  write("sys/devices/system/node/node0/cpulist", "0-15,32-47\n");
  write("sys/devices/system/node/node1/cpulist", "16-31,48-63\n");
  write("sys/devices/system/node/possible", "0-1\n");  // not a node folder
  write("sys/class/infiniband/mlx5_0/node_type", "1: CA\n");
  write("dev/nvidia0", "");
  write("dev/nvidia10", "");
  write("dev/nvidiactl", "");
  write("dev/nvidia-uvm", "");
  fs::create_directories(root_ / "dev/shm");
  fs::create_directories(root_ / "bin");
  write("bin/mpirun", "#!/bin/sh\n");
  fs::permissions(root_ / "bin/mpirun", fs::perms::owner_all);

  HostProbe probe;
  probe.root = root_.string();
  probe.path_env = "/nonexistent:" + (root_ / "bin").string();
  const HostFacts facts = gather_host_facts(probe);
  EXPECT_EQ(facts.driver_module_version, "535.129.03");
  ASSERT_EQ(facts.driver_gpus.size(), 2u);
  EXPECT_EQ(facts.driver_gpus[0].pci_bus_id, "0000:07:00.0");
  EXPECT_EQ(facts.driver_gpus[0].model, "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(facts.driver_gpus[1].pci_bus_id, "0000:0f:00.0");  // from the folder name, lower-cased
  ASSERT_EQ(facts.numa_nodes.size(), 2u);
  EXPECT_EQ(facts.numa_nodes[1].id, 1);
  EXPECT_EQ(facts.numa_nodes[1].cpus, 32);
  EXPECT_EQ(facts.device_nodes, (std::vector<std::string>{"/dev/nvidia0", "/dev/nvidia10"}));
  EXPECT_EQ(facts.infiniband_devices, std::vector<std::string>{"mlx5_0"});
  EXPECT_EQ(facts.mpirun_path, (root_ / "bin/mpirun").string());
  EXPECT_TRUE(facts.shm_present);
  EXPECT_GT(facts.shm_total_bytes, 0u);
  EXPECT_GE(facts.cores_online, facts.cores_allowed);
  EXPECT_GE(facts.cores_allowed, 1);
}

TEST_F(HostFactsTest, AnEmptyRootHasNoDriverNoShmNoMpi) {
  HostProbe probe;
  probe.root = root_.string();
  probe.path_env = "";
  const HostFacts facts = gather_host_facts(probe);
  EXPECT_TRUE(facts.driver_gpus.empty());
  EXPECT_TRUE(facts.device_nodes.empty());
  EXPECT_TRUE(facts.driver_module_version.empty());
  EXPECT_FALSE(facts.shm_present);
  EXPECT_TRUE(facts.mpirun_path.empty());
}

TEST_F(HostFactsTest, FindsTheFabricManagersProcessByItsName) {
  write("proc/812/comm", "sshd\n");
  HostProbe probe;
  probe.root = root_.string();
  EXPECT_FALSE(gather_host_facts(probe).fabric_manager_running);
  write("proc/2291/comm", "nv-fabricmanager\n");
  write("proc/self/comm", "nv-fabricmanager\n");  // not a pid: ignored either way
  EXPECT_TRUE(gather_host_facts(probe).fabric_manager_running);
}

// A process that exits while doctor reads its /proc entry fails the read (ESRCH); a file
// that opens but cannot be read (here a directory: EISDIR) stands in for it.
TEST_F(HostFactsTest, AProcessEntryThatCannotBeReadIsSkipped) {
  fs::create_directories(root_ / "proc/4242/comm");
  HostProbe probe;
  probe.root = root_.string();
  EXPECT_NO_THROW(EXPECT_FALSE(gather_host_facts(probe).fabric_manager_running));
}

TEST_F(HostFactsTest, ReadsXidEventsFromTheKernelLog) {
  HostProbe probe;
  probe.root = root_.string();
  HostFacts facts = gather_host_facts(probe);
  EXPECT_FALSE(facts.kernel_log_read);  // no /dev/kmsg: unknown, not clean
  EXPECT_TRUE(facts.xid_events.empty());

  write("dev/kmsg",
        "6,1233,5678000,-;nvidia-nvlink: Nvlink Core is being initialized\n"
        "6,1234,5678901,-;NVRM: Xid (PCI:0000:07:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
        "4,1240,5679999,-;NVRM: Xid (PCI:0000:0f:00): 13, pid=99, name=train, Graphics SM Warp Exception\n");
  facts = gather_host_facts(probe);
  EXPECT_TRUE(facts.kernel_log_read);
  ASSERT_EQ(facts.xid_events.size(), 2u);
  EXPECT_EQ(facts.xid_events[0].pci_bus_id, "0000:07:00.0");
  EXPECT_EQ(facts.xid_events[0].xid, 79);
  EXPECT_EQ(facts.xid_events[1].xid, 13);

  write("dev/kmsg", "6,1,1,-;Linux version 6.1.0\n");
  facts = gather_host_facts(probe);
  EXPECT_TRUE(facts.kernel_log_read);  // read, and clean
  EXPECT_TRUE(facts.xid_events.empty());
}

TEST_F(HostFactsTest, AKernelLogThatCannotBeReadIsUnknown) {
  fs::create_directories(root_ / "dev/kmsg");  // opens, but read() fails
  HostProbe probe;
  probe.root = root_.string();
  EXPECT_FALSE(gather_host_facts(probe).kernel_log_read);
}

// The real /dev/kmsg is a character device that would block at its end without O_NONBLOCK;
// this returns (the test's timeout would catch a hang) and reads it where this user may.
TEST(HostFacts, ReadsTheRealKernelLogWithoutBlocking) {
  const int fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK);
  const bool readable = fd >= 0;
  if (fd >= 0) close(fd);
  HostProbe probe;
  probe.path_env = "";
  EXPECT_EQ(gather_host_facts(probe).kernel_log_read, readable);
}

TEST_F(HostFactsTest, ReadsTheIommuSettings) {
  write("proc/cmdline", "BOOT_IMAGE=/vmlinuz-6.1.0 root=UUID=1234 ro intel_iommu=on iommu=pt quiet\n");
  fs::create_directories(root_ / "sys/class/iommu/dmar0");
  write("sys/kernel/iommu_groups/0/type", "identity\n");
  write("sys/kernel/iommu_groups/1/type", "DMA-FQ\n");
  write("sys/kernel/iommu_groups/2/type", "identity\n");
  HostProbe probe;
  probe.root = root_.string();
  const HostFacts facts = gather_host_facts(probe);
  EXPECT_TRUE(facts.kernel_cmdline_read);
  EXPECT_EQ(facts.iommu_cmdline, (std::vector<std::string>{"intel_iommu=on", "iommu=pt"}));
  EXPECT_TRUE(facts.iommu_present);
  EXPECT_EQ(facts.iommu_domain_types, (std::vector<std::string>{"DMA-FQ", "identity"}));
}

TEST_F(HostFactsTest, NoIommuAndNoCommandLine) {
  fs::create_directories(root_ / "sys/class/iommu");  // present but empty: no IOMMU active
  HostProbe probe;
  probe.root = root_.string();
  HostFacts facts = gather_host_facts(probe);
  EXPECT_FALSE(facts.kernel_cmdline_read);
  EXPECT_FALSE(facts.iommu_present);
  write("proc/cmdline", "root=/dev/sda1 amd_iommu=off\n");
  facts = gather_host_facts(probe);
  EXPECT_TRUE(facts.kernel_cmdline_read);
  EXPECT_EQ(facts.iommu_cmdline, std::vector<std::string>{"amd_iommu=off"});
}

// PCI config space as sysfs gives it to root: 4096 bytes, the extended capabilities from
// 0x100 on, each header little-endian (id bits 0-15, version 16-19, next 20-31).
class ConfigSpace {
 public:
  ConfigSpace() : bytes_(4096, '\0') {}
  ConfigSpace& capability(size_t offset, uint16_t id, size_t next) {
    put(offset, uint32_t{id} | (1u << 16) | (static_cast<uint32_t>(next) << 20), 4);
    return *this;
  }
  ConfigSpace& acs(size_t offset, size_t next, uint16_t control) {
    capability(offset, 0x000D, next);
    put(offset + 4, 0x005f, 2);  // ACS Capability: which controls the port implements
    put(offset + 6, control, 2);
    return *this;
  }
  std::string bytes() const { return bytes_; }

 private:
  void put(size_t offset, uint32_t value, size_t width) {
    for (size_t i = 0; i < width; ++i) bytes_[offset + i] = static_cast<char>((value >> (8 * i)) & 0xff);
  }
  std::string bytes_;
};

constexpr uint16_t kAer = 0x0001, kSecondaryPcie = 0x0019;

TEST(HostFacts, FindsTheAcsControlRegisterInConfigSpace) {
  // AER at 0x100, then ACS at 0x148 with Source Validation, Request and Completion Redirect
  // and Upstream Forwarding on: what Linux sets on a root port when the IOMMU is on.
  EXPECT_EQ(acs_control(ConfigSpace().capability(0x100, kAer, 0x148).acs(0x148, 0, 0x001d).bytes()), 0x001d);
  EXPECT_EQ(acs_control(ConfigSpace().acs(0x100, 0x200, 0x0000).bytes()), 0x0000);
  EXPECT_EQ(acs_control(ConfigSpace().capability(0x100, kAer, 0x150).capability(0x150, kSecondaryPcie, 0).bytes()),
            std::nullopt);
  EXPECT_EQ(acs_control(ConfigSpace().bytes()), std::nullopt);                                      // no capabilities
  EXPECT_EQ(acs_control(ConfigSpace().capability(0x100, kAer, 0x100).bytes()), std::nullopt);       // a loop ends
  EXPECT_EQ(acs_control(ConfigSpace().acs(0x148, 0, 0x001d).bytes().substr(0, 64)), std::nullopt);  // not root
}

TEST_F(HostFactsTest, KeepsTheBridgesWhoseAcsRedirectsPeerToPeerTraffic) {
  const std::string devices = "sys/bus/pci/devices/";
  // A root port redirecting requests and completions.
  write(devices + "0000:00:01.0/class", "0x060400\n");
  write(devices + "0000:00:01.0/config", ConfigSpace().capability(0x100, kAer, 0x148).acs(0x148, 0, 0x001d).bytes());
  // A switch port with only Source Validation: peer-to-peer passes.
  write(devices + "0000:00:02.0/class", "0x060400\n");
  write(devices + "0000:00:02.0/config", ConfigSpace().acs(0x100, 0, 0x0001).bytes());
  // A switch port with P2P Egress Control alone.
  write(devices + "0000:05:00.0/class", "0x060400\n");
  write(devices + "0000:05:00.0/config", ConfigSpace().acs(0x100, 0, 0x0020).bytes());
  // A bridge without ACS, and one read without root (64 bytes).
  write(devices + "0000:00:03.0/class", "0x060400\n");
  write(devices + "0000:00:03.0/config", ConfigSpace().capability(0x100, kAer, 0).bytes());
  write(devices + "0000:00:04.0/class", "0x060400\n");
  write(devices + "0000:00:04.0/config", ConfigSpace().bytes().substr(0, 64));
  // A GPU (class 0x0302) is no bridge, whatever its config space says.
  write(devices + "0000:07:00.0/class", "0x030200\n");
  write(devices + "0000:07:00.0/config", ConfigSpace().acs(0x100, 0, 0x001d).bytes());

  HostProbe probe;
  probe.root = root_.string();
  const HostFacts facts = gather_host_facts(probe);
  EXPECT_EQ(facts.pci_bridges, 5);
  EXPECT_EQ(facts.pci_bridges_unreadable, 1);
  ASSERT_EQ(facts.acs_redirecting_bridges.size(), 2u);
  EXPECT_EQ(facts.acs_redirecting_bridges[0].bdf, "0000:00:01.0");
  EXPECT_EQ(facts.acs_redirecting_bridges[0].control, 0x001d);
  EXPECT_EQ(facts.acs_redirecting_bridges[1].bdf, "0000:05:00.0");
  EXPECT_EQ(facts.acs_redirecting_bridges[1].control, 0x0020);
}

TEST(HostFacts, CountsCpulists) {
  EXPECT_EQ(count_cpulist("0-3,8,10-11"), 7);
  EXPECT_EQ(count_cpulist("5"), 1);
  EXPECT_EQ(count_cpulist(""), 0);
  EXPECT_EQ(count_cpulist("3-1"), -1);
  EXPECT_EQ(count_cpulist("a-b"), -1);
}

}  // namespace
}  // namespace lockstep::tools
