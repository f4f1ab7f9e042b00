// What `lockstep doctor` knows about this host apart from NVML: /dev/shm, the locked-memory
// limit, cores and NUMA nodes, MPI, and the NVIDIA driver's own files (its GPU list, device
// nodes, kernel module version), so a GPU the driver has but NVML misses is caught.
//
// Every path is read under `HostProbe::root` so tests build fake /proc, /sys and /dev
// trees in a temporary folder; the checks (doctor_checks.h) are pure functions of these facts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::tools {

struct NumaNode {
  int id = 0;
  std::string cpulist;  // "0-15,32-47" as /sys prints it
  int cpus = 0;
};

// A GPU as /proc/driver/nvidia/gpus/<bus id>/information describes it.
struct DriverGpu {
  std::string pci_bus_id;  // normalized: "0000:07:00.0"
  std::string model;       // "NVIDIA A100-SXM4-80GB"
};

struct HostFacts {
  bool shm_present = false;
  uint64_t shm_total_bytes = 0, shm_free_bytes = 0;
  std::optional<uint64_t> memlock_bytes;  // RLIMIT_MEMLOCK's soft limit; empty = unlimited
  int cores_online = 0;                   // sysconf(_SC_NPROCESSORS_ONLN)
  int cores_allowed = 0;                  // this process's affinity mask (taskset, cgroups, Slurm)
  std::vector<NumaNode> numa_nodes;
  std::vector<std::string> infiniband_devices;  // /sys/class/infiniband/*: "mlx5_0", …
  std::string mpirun_path;                      // empty when mpirun is not on PATH
  // The NVIDIA kernel module: "535.129.03" from /proc/driver/nvidia/version; empty when not loaded.
  std::string driver_module_version;
  std::vector<DriverGpu> driver_gpus;
  std::vector<std::string> device_nodes;  // "/dev/nvidia0", … (numbered nodes only)
  // A process named nv-fabricmanager in /proc: NVSwitch systems need it for CUDA to start.
  bool fabric_manager_running = false;
};

struct HostProbe {
  std::string root;      // prefix of every probed path: "" on a real host
  std::string path_env;  // PATH, to find mpirun
  std::string shm_path = "/dev/shm";
};

// Reads the facts. Never throws: what cannot be read stays empty or zero.
HostFacts gather_host_facts(const HostProbe& probe);

// CPUs in a Linux cpulist: "0-3,8,10-11" has 7; -1 when the text is not one.
int count_cpulist(const std::string& cpulist);

}  // namespace lockstep::tools
