// HostFacts read from a fake /proc, /sys and /dev tree written here, so the parsing of the
// driver's files, NUMA cpulists and device nodes is checked against known contents.
#include "tools/doctor/host_facts.h"

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

TEST(HostFacts, CountsCpulists) {
  EXPECT_EQ(count_cpulist("0-3,8,10-11"), 7);
  EXPECT_EQ(count_cpulist("5"), 1);
  EXPECT_EQ(count_cpulist(""), 0);
  EXPECT_EQ(count_cpulist("3-1"), -1);
  EXPECT_EQ(count_cpulist("a-b"), -1);
}

}  // namespace
}  // namespace lockstep::tools
