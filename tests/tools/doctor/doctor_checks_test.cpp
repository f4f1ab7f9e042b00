// doctor's rules on GPU states and host facts built by hand: each rule on both sides of
// its threshold. The expected statuses come from the rules as the docs state them (CUDA's
// compatibility table, CUDA's reading of CUDA_VISIBLE_DEVICES), not from earlier output.
#include "tools/doctor/doctor_checks.h"

#include <gtest/gtest.h>

#include "lockstep/gpu/pci_bus_id.h"

namespace lockstep::tools {
namespace {

using gpu::GpuDevice;
using gpu::GpuLink;
using gpu::GpuPath;

GpuDevice device(unsigned index, const std::string& name = "NVIDIA A100-SXM4-80GB", int major = 8, int minor = 0,
                 unsigned sms = 108) {
  GpuDevice d;
  d.index = index;
  d.name = name;
  d.uuid = "GPU-" + std::to_string(index) + "aaaaaaa-0000-0000-0000-00000000000" + std::to_string(index);
  d.pci_bus_id = "00000000:" + std::string(index < 10 ? "0" : "") + std::to_string(index) + ":00.0";
  d.compute_major = major;
  d.compute_minor = minor;
  d.multiprocessors = sms;
  d.memory_total = uint64_t{80} << 30;
  return d;
}

// A loaded driver with `n` identical GPUs, a CUDA 12.4 driver, a CUDA 12.4 build, and a
// host that passes every host rule.
DoctorInput healthy(unsigned n) {
  DoctorInput in;
  in.gpus.library_path = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";
  in.gpus.driver_version = "550.54.15";
  in.gpus.cuda_driver_version = 12040;
  for (unsigned i = 0; i < n; ++i) {
    in.gpus.devices.push_back(device(i));
    in.host.driver_gpus.push_back({"0000:" + std::string(i < 10 ? "0" : "") + std::to_string(i) + ":00.0", "A100"});
    in.host.device_nodes.push_back("/dev/nvidia" + std::to_string(i));
  }
  in.build.cuda_runtime_version = 12040;
  in.build.nccl_version = 22105;
  in.build.nccl_cuda_version = 12040;
  in.host.shm_present = true;
  in.host.shm_total_bytes = in.host.shm_free_bytes = uint64_t{32} << 30;
  in.host.cores_online = in.host.cores_allowed = 64;
  in.host.mpirun_path = "/usr/bin/mpirun";
  in.build.mpi = true;
  in.env.uid = 1000;
  return in;
}

TEST(DoctorChecks, HealthyEightGpuHostPassesEverything) {
  DoctorInput in = healthy(8);
  in.gpus.topology.assign(8, std::vector<GpuPath>(8, GpuPath{GpuLink::kNvlink, 12}));
  for (int i = 0; i < 8; ++i) in.gpus.topology[i][i] = GpuPath{GpuLink::kSelf, 0};
  const std::vector<Check> checks = run_checks(in);
  for (const Check& c : checks)
    EXPECT_TRUE(c.status == Status::kPass || c.status == Status::kInfo) << c.name << ": " << c.summary;
  EXPECT_EQ(exit_code(checks), 0);
  EXPECT_EQ(checks.size(), 22u);
}

TEST(DoctorChecks, ExitCodeIsTheWorstStatus) {
  std::vector<Check> checks = {{"a", Status::kPass, "", "", {}}, {"b", Status::kInfo, "", "", {}}};
  EXPECT_EQ(exit_code(checks), 0);
  checks.push_back({"c", Status::kWarn, "", "", {}});
  EXPECT_EQ(exit_code(checks), 1);
  checks.push_back({"d", Status::kFail, "", "", {}});
  checks.push_back({"e", Status::kWarn, "", "", {}});
  EXPECT_EQ(exit_code(checks), 2);
}

TEST(DoctorChecks, NoDriverIsInfoAndNamesTheCpuDevices) {
  DoctorInput in = healthy(0);
  in.gpus.library_path.clear();
  in.gpus.load_error = "libnvidia-ml.so.1: cannot open shared object file";
  in.host.cores_allowed = 6;
  const Check c = check_nvml(in);
  EXPECT_EQ(c.status, Status::kInfo);
  EXPECT_NE(c.summary.find("cpu:0 … cpu:5"), std::string::npos) << c.summary;
  // Without GPUs only the host rules follow the driver rules.
  const std::vector<Check> checks = run_checks(in);
  for (const Check& check : checks) EXPECT_NE(check.name, "ecc");
  EXPECT_LT(exit_code(checks), 2);
}

TEST(DoctorChecks, DriverFilesWithoutNvmlFail) {
  DoctorInput in = healthy(2);
  in.gpus.devices.clear();
  in.gpus.load_error = "libnvidia-ml.so.1: cannot open shared object file";
  EXPECT_EQ(check_nvml(in).status, Status::kFail);
  EXPECT_EQ(check_gpus_seen(in).status, Status::kFail);
}

TEST(DoctorChecks, VersionMismatchNamesTheKernelModule) {
  DoctorInput in = healthy(0);
  in.gpus.load_error = "nvmlInit: Driver/library version mismatch";
  in.host.driver_module_version = "535.104.05";
  const Check c = check_nvml(in);
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_NE(c.summary.find("535.104.05"), std::string::npos) << c.summary;
  EXPECT_NE(c.fix.find("reboot"), std::string::npos);
}

TEST(DoctorChecks, FailedReadIsAFailure) {
  DoctorInput in = healthy(0);
  in.read_error = "nvmlDeviceGetHandleByIndex_v2: Unknown Error";
  EXPECT_EQ(check_nvml(in).status, Status::kFail);
  DoctorInput one = healthy(1);
  one.gpus.devices[0].unavailable = {"nvmlDeviceGetPowerUsage: Unknown Error"};
  const Check c = check_nvml(one);
  EXPECT_EQ(c.status, Status::kPass);
  EXPECT_EQ(c.details, std::vector<std::string>{"GPU 0: nvmlDeviceGetPowerUsage: Unknown Error"});
}

TEST(DoctorChecks, GpuInDriverFilesButNotInNvmlFails) {
  DoctorInput in = healthy(4);
  EXPECT_EQ(check_gpus_seen(in).status, Status::kPass);
  in.gpus.devices.pop_back();  // GPU 3 fell off the bus: /proc still lists it
  const Check c = check_gpus_seen(in);
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_NE(c.summary.find("0000:03:00.0"), std::string::npos) << c.summary;
}

TEST(DoctorChecks, ContainerGivenSomeGpusIsNotAFailure) {
  DoctorInput in = healthy(4);
  in.gpus.devices.resize(2);
  in.host.device_nodes.resize(2);  // only its own device nodes exist in the container
  EXPECT_EQ(check_gpus_seen(in).status, Status::kInfo);
}

TEST(DoctorChecks, NvmlBusIdsMatchTheDriversFolderNames) {
  EXPECT_EQ(gpu::normalize_pci_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(gpu::normalize_pci_bus_id("0000:3b:00.0"), "0000:3b:00.0");
}

TEST(DoctorChecks, DriverVsRuntimeFollowsMinorVersionCompatibility) {
  DoctorInput in = healthy(1);
  in.build.cuda_runtime_version = 12040;
  for (int driver : {12040, 12060, 13000}) {
    in.gpus.cuda_driver_version = driver;
    EXPECT_EQ(check_driver_vs_cuda_runtime(in).status, Status::kPass) << driver;
  }
  in.gpus.cuda_driver_version = 12020;  // same major, older minor
  const Check warn = check_driver_vs_cuda_runtime(in);
  EXPECT_EQ(warn.status, Status::kWarn);
  EXPECT_NE(warn.summary.find("PTX"), std::string::npos) << warn.summary;
  in.gpus.cuda_driver_version = 11080;  // older major
  const Check fail = check_driver_vs_cuda_runtime(in);
  EXPECT_EQ(fail.status, Status::kFail);
  EXPECT_NE(fail.summary.find("525.60.13"), std::string::npos) << fail.summary;
  EXPECT_NE(fail.fix.find("cuda-compat"), std::string::npos) << fail.fix;
}

TEST(DoctorChecks, MinimumDriversAreNvidiasTable) {
  EXPECT_EQ(minimum_driver_for_cuda_major(11), "450.80.02");
  EXPECT_EQ(minimum_driver_for_cuda_major(12), "525.60.13");
  EXPECT_EQ(minimum_driver_for_cuda_major(13), "580");
  EXPECT_EQ(minimum_driver_for_cuda_major(10), "");
}

TEST(DoctorChecks, BuildWithoutCudaIsInfo) {
  DoctorInput in = healthy(1);
  in.build = {};
  EXPECT_EQ(check_driver_vs_cuda_runtime(in).status, Status::kInfo);
  EXPECT_EQ(check_driver_vs_nccl(in).status, Status::kInfo);
}

TEST(DoctorChecks, DriverVsNcclComparesTheCudaNcclWasBuiltFor) {
  DoctorInput in = healthy(1);
  in.build.nccl_cuda_version = 12040;
  in.gpus.cuda_driver_version = 12040;
  EXPECT_EQ(check_driver_vs_nccl(in).status, Status::kPass);
  in.gpus.cuda_driver_version = 11040;
  const Check c = check_driver_vs_nccl(in);
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_NE(c.summary.find("NCCL 2.21.5"), std::string::npos) << c.summary;
}

TEST(DoctorChecks, VersionStrings) {
  EXPECT_EQ(gpu::cuda_version_string(12040), "12.4");
  EXPECT_EQ(gpu::cuda_version_string(11080), "11.8");
  EXPECT_EQ(gpu::cuda_version_string(0), "none");
  EXPECT_EQ(gpu::nccl_version_string(22809), "2.28.9");
  EXPECT_EQ(gpu::nccl_version_string(2804), "2.8.4");  // before 2.9: 1000 * major + 100 * minor + patch
}

TEST(DoctorChecks, VisibleDevicesUnsetOrValidPasses) {
  DoctorInput in = healthy(4);
  EXPECT_EQ(check_visible_devices(in).status, Status::kPass);
  in.env.cuda_visible_devices = "2,3";
  const Check c = check_visible_devices(in);
  EXPECT_EQ(c.status, Status::kPass) << c.summary;
  ASSERT_EQ(c.details.size(), 2u);
  EXPECT_NE(c.details[0].find("cuda:0 = NVML GPU 2"), std::string::npos);
  in.env.cuda_visible_devices = "GPU-3aaa";  // a unique UUID prefix
  EXPECT_EQ(check_visible_devices(in).status, Status::kPass) << check_visible_devices(in).summary;
}

TEST(DoctorChecks, VisibleDevicesStopsAtAnEntryCudaCannotUse) {
  DoctorInput in = healthy(4);
  in.env.cuda_visible_devices = "0,1,4,2";  // 4 is out of range: CUDA sees 0 and 1 only
  Check c = check_visible_devices(in);
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_NE(c.summary.find("entry 3 (\"4\")"), std::string::npos) << c.summary;
  EXPECT_NE(c.summary.find("so 2 GPUs are visible"), std::string::npos) << c.summary;
  in.env.cuda_visible_devices = "GPU-ffff,0";  // matches nothing, first: no GPU at all
  c = check_visible_devices(in);
  EXPECT_EQ(c.status, Status::kFail);
  in.env.cuda_visible_devices = "0,0";
  EXPECT_EQ(check_visible_devices(in).status, Status::kWarn);
  in.env.cuda_visible_devices = "";
  EXPECT_EQ(check_visible_devices(in).status, Status::kWarn);
}

TEST(DoctorChecks, MixedGpusNumberDifferentlyWithoutPciBusOrder) {
  DoctorInput in = healthy(2);
  in.gpus.devices[0] = device(0, "Tesla T4", 7, 5, 40);  // slower GPU first on the bus
  Check c = check_visible_devices(in);
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_NE(c.summary.find("CUDA 0 is nvidia-smi 1"), std::string::npos) << c.summary;
  EXPECT_NE(c.fix.find("CUDA_DEVICE_ORDER=PCI_BUS_ID"), std::string::npos) << c.fix;
  in.env.cuda_visible_devices = "0";  // CUDA's 0 is the A100, NVML's 1
  c = check_visible_devices(in);
  EXPECT_EQ(c.status, Status::kWarn);
  ASSERT_EQ(c.details.size(), 1u);
  EXPECT_EQ(c.details[0], "cuda:0 = NVML GPU 1 (NVIDIA A100-SXM4-80GB)") << c.details[0];
  in.env.cuda_device_order = "PCI_BUS_ID";
  EXPECT_EQ(check_visible_devices(in).status, Status::kPass);
}

TEST(DoctorChecks, LeasedGpusAreNamedWithTheirHolders) {
  DoctorInput in = healthy(4);
  EXPECT_EQ(check_gpu_leases(in).status, Status::kPass);
  in.leases[in.gpus.devices[1].index] = "pid 4242 (user ana): lockstep run -n 1 -- train.py";
  const Check c = check_gpu_leases(in);
  EXPECT_EQ(c.status, Status::kInfo);
  EXPECT_NE(c.summary.find("GPU 1"), std::string::npos) << c.summary;
  ASSERT_EQ(c.details.size(), 1u);
  EXPECT_EQ(c.details[0], "GPU 1: leased by pid 4242 (user ana): lockstep run -n 1 -- train.py");
}

TEST(DoctorChecks, OtherUsersProcessesWarnWithGpusAndMemory) {
  DoctorInput in = healthy(4);
  in.gpus.devices[0].processes.push_back({100, uint64_t{2} << 30, true, 1000, "me", "python train.py", {}, {}});
  EXPECT_EQ(check_other_processes(in).status, Status::kPass);
  in.gpus.devices[2].processes.push_back({200, uint64_t{20} << 30, true, 1001, "alice", "python big.py", {}, {}});
  in.gpus.devices[3].processes.push_back({300, uint64_t{3} << 29, false, 0, "", "", {}, {}});
  const Check c = check_other_processes(in);
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_NE(c.summary.find("GPU 2 (20 GiB by alice)"), std::string::npos) << c.summary;
  EXPECT_NE(c.summary.find("GPU 3 (1.5 GiB by pid 300)"), std::string::npos) << c.summary;
  bool namespace_said = false;
  for (const std::string& line : c.details)
    namespace_said |= line.find("outside this container's PID namespace") != std::string::npos;
  EXPECT_TRUE(namespace_said);
}

TEST(DoctorChecks, UncorrectedEccFails) {
  DoctorInput in = healthy(2);
  in.gpus.devices[1].ecc_uncorrected_volatile = 0;
  in.gpus.devices[1].ecc_corrected_volatile = 5;
  EXPECT_EQ(check_ecc(in).status, Status::kPass);
  in.gpus.devices[1].ecc_uncorrected_volatile = 1;
  const Check c = check_ecc(in);
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_NE(c.summary.find("GPU 1"), std::string::npos);
}

TEST(DoctorChecks, PendingRetirementFailsRetiredPagesWarn) {
  DoctorInput in = healthy(2);
  // Nothing read is not a pass.
  const Check unread = check_retired_pages(in);
  EXPECT_EQ(unread.status, Status::kInfo);
  EXPECT_EQ(unread.summary.rfind("unknown on GPU 0, GPU 1", 0), 0u) << unread.summary;
  for (auto& d : in.gpus.devices) {
    d.retired_pages = 0;
    d.retired_pages_pending = false;
  }
  EXPECT_EQ(check_retired_pages(in).status, Status::kPass);
  in.gpus.devices[0].retired_pages = 2;
  EXPECT_EQ(check_retired_pages(in).status, Status::kWarn);
  in.gpus.devices[0].retired_pages_pending = true;
  EXPECT_EQ(check_retired_pages(in).status, Status::kFail);
}

// A100 and H100 remap rows instead of retiring pages: a pending or failed remap fails, rows
// remapped for uncorrectable errors warn, for correctable ones pass.
TEST(DoctorChecks, RowRemappingOnAmpereAndLater) {
  DoctorInput in = healthy(2);
  EXPECT_EQ(check_row_remapping(in).status, Status::kInfo);  // GPUs that do not remap
  for (auto& d : in.gpus.devices) {
    d.remapped_rows_correctable = 0;
    d.remapped_rows_uncorrectable = 0;
    d.remap_pending = d.remap_failed = false;
  }
  EXPECT_EQ(check_row_remapping(in).status, Status::kPass);
  const Check retired = check_retired_pages(in);
  EXPECT_EQ(retired.status, Status::kInfo);
  EXPECT_NE(retired.summary.find("remap rows instead"), std::string::npos) << retired.summary;
  in.gpus.devices[1].remapped_rows_correctable = 5;
  EXPECT_EQ(check_row_remapping(in).status, Status::kPass);
  EXPECT_EQ(check_row_remapping(in).details.size(), 1u);
  in.gpus.devices[1].remapped_rows_uncorrectable = 1;
  EXPECT_EQ(check_row_remapping(in).status, Status::kWarn);
  in.gpus.devices[0].remap_pending = true;
  Check c = check_row_remapping(in);
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_NE(c.summary.find("pending on GPU 0"), std::string::npos) << c.summary;
  in.gpus.devices[1].remap_failed = true;
  c = check_row_remapping(in);
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_NE(c.summary.find("failed on GPU 1"), std::string::npos) << c.summary;
}

TEST(DoctorChecks, ThermalAndPowerThrottlingWarnIdleDoesNot) {
  DoctorInput in = healthy(2);
  in.gpus.devices[0].throttle_reasons = gpu::kThrottleGpuIdle;
  EXPECT_EQ(check_throttling(in).status, Status::kPass);
  in.gpus.devices[1].throttle_reasons = gpu::kThrottleHwThermalSlowdown;
  Check c = check_throttling(in);
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_NE(c.summary.find("thermal on GPU 1"), std::string::npos) << c.summary;
  in.gpus.devices[1].throttle_reasons = gpu::kThrottleSwPowerCap;
  c = check_throttling(in);
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_NE(c.summary.find("power on GPU 1"), std::string::npos) << c.summary;
}

TEST(DoctorChecks, PersistenceOffWarns) {
  DoctorInput in = healthy(2);
  in.gpus.devices[0].persistence_mode = true;
  EXPECT_EQ(check_persistence(in).status, Status::kPass);
  in.gpus.devices[1].persistence_mode = false;
  const Check c = check_persistence(in);
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_NE(c.fix.find("nvidia-smi -pm 1"), std::string::npos);
}

std::vector<std::vector<GpuPath>> uniform(unsigned n, GpuPath path) {
  std::vector<std::vector<GpuPath>> t(n, std::vector<GpuPath>(n, path));
  for (unsigned i = 0; i < n; ++i) t[i][i] = GpuPath{GpuLink::kSelf, 0};
  return t;
}

TEST(DoctorChecks, TopologyPrintsTheMatrixAsNvidiaSmiDoes) {
  DoctorInput in = healthy(2);
  in.gpus.topology = uniform(2, GpuPath{GpuLink::kNvlink, 12});
  const Check c = check_topology(in);
  EXPECT_EQ(c.status, Status::kPass);
  ASSERT_GE(c.details.size(), 3u);
  EXPECT_EQ(c.details[0], "      GPU0  GPU1");
  EXPECT_EQ(c.details[1], "GPU0  X     NV12");
  EXPECT_EQ(c.details[2], "GPU1  NV12  X");
}

TEST(DoctorChecks, TopologyWarnsOnlyWhenSomePairsLackNvlink) {
  DoctorInput in = healthy(4);
  in.gpus.topology = uniform(4, GpuPath{GpuLink::kNvlink, 4});
  in.gpus.topology[0][3] = in.gpus.topology[3][0] = GpuPath{GpuLink::kSys, 0};
  const Check mixed = check_topology(in);
  EXPECT_EQ(mixed.status, Status::kWarn);
  EXPECT_NE(mixed.summary.find("1 of 6 GPU pairs"), std::string::npos) << mixed.summary;
  in.gpus.topology = uniform(4, GpuPath{GpuLink::kPhb, 0});
  const Check pcie = check_topology(in);
  EXPECT_EQ(pcie.status, Status::kInfo);
  EXPECT_NE(pcie.summary.find("PCIe"), std::string::npos);
}

TEST(DoctorChecks, ShmBelowWhatARunNeedsFailsBelowAGibWarns) {
  DoctorInput in = healthy(8);
  in.host.shm_free_bytes = uint64_t{64} << 20;  // docker's default
  Check c = check_shm(in);
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_NE(c.fix.find("--shm-size"), std::string::npos);
  EXPECT_NE(c.fix.find("--ipc=host"), std::string::npos);
  in.host.shm_free_bytes = kShmFailBytes - 1;
  EXPECT_EQ(check_shm(in).status, Status::kFail);
  in.host.shm_free_bytes = kShmFailBytes;
  EXPECT_EQ(check_shm(in).status, Status::kWarn);
  in.host.shm_free_bytes = kShmWarnBytes - 1;
  EXPECT_EQ(check_shm(in).status, Status::kWarn);
  in.host.shm_free_bytes = kShmWarnBytes;
  EXPECT_EQ(check_shm(in).status, Status::kPass);
  // Huge staging buffers raise the need past the fixed floor.
  in.env.shm_staging_bytes = std::to_string(uint64_t{256} << 20);  // 8 ranks: 2 GiB
  EXPECT_EQ(check_shm(in).status, Status::kFail);
  in.host.shm_present = false;
  EXPECT_EQ(check_shm(in).status, Status::kFail);
}

TEST(DoctorChecks, SmallMemlockWarnsWhereRdmaIsUnlimitedPasses) {
  DoctorInput in = healthy(1);
  in.host.infiniband_devices = {"mlx5_0"};
  EXPECT_EQ(check_memlock(in).status, Status::kPass);
  in.host.memlock_bytes = kMemlockWarnBytes;
  EXPECT_EQ(check_memlock(in).status, Status::kPass);
  in.host.memlock_bytes = kMemlockWarnBytes - 1;
  const Check c = check_memlock(in);
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_NE(c.fix.find("ulimit -l unlimited"), std::string::npos);
  in.host.infiniband_devices.clear();  // nothing registers memory against the limit
  EXPECT_EQ(check_memlock(in).status, Status::kInfo);
}

TEST(DoctorChecks, FewerThanTwoCoresPerGpuWarns) {
  DoctorInput in = healthy(8);
  in.host.cores_allowed = 16;
  in.host.numa_nodes = {{0, "0-7", 8}, {1, "8-15", 8}};
  Check c = check_cores(in);
  EXPECT_EQ(c.status, Status::kInfo);
  EXPECT_NE(c.summary.find("2 NUMA nodes"), std::string::npos) << c.summary;
  in.host.cores_allowed = 15;
  EXPECT_EQ(check_cores(in).status, Status::kWarn);
}

TEST(DoctorChecks, MpiRunnerWithoutBackendWarns) {
  DoctorInput in = healthy(1);
  EXPECT_EQ(check_mpi(in).status, Status::kPass);
  in.build.mpi = false;
  EXPECT_EQ(check_mpi(in).status, Status::kWarn);
  in.host.mpirun_path.clear();
  EXPECT_EQ(check_mpi(in).status, Status::kInfo);
}

}  // namespace
}  // namespace lockstep::tools
