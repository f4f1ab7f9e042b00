// What `lockstep doctor` knows about this host apart from NVML: /dev/shm, the locked-memory
// limit, cores and NUMA nodes, MPI, the NVIDIA driver's own files (its GPU list, device
// nodes, kernel module version), so a GPU the driver has but NVML misses is caught, the
// driver's Xid reports in the kernel log, and the IOMMU and PCIe ACS settings that decide
// whether GPUs can reach each other peer-to-peer.
//
// Every path is read under `HostProbe::root` so tests build fake /proc, /sys and /dev
// trees in a temporary folder; the checks (doctor_checks.h) are pure functions of these facts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/gpu/xid_log.h"

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

// A PCI bridge whose ACS (Access Control Services) sends peer-to-peer traffic up to the root
// complex instead of across the bridge.
struct AcsBridge {
  std::string bdf;       // "0000:00:01.0"
  uint16_t control = 0;  // the ACS Control register
};

// ACS Control bits that reroute or block peer-to-peer requests (PCIe Base Spec, ACS Extended
// Capability): P2P Request Redirect, P2P Completion Redirect, P2P Egress Control.
inline constexpr uint16_t kAcsRequestRedirect = 1u << 2;
inline constexpr uint16_t kAcsCompletionRedirect = 1u << 3;
inline constexpr uint16_t kAcsEgressControl = 1u << 5;
inline constexpr uint16_t kAcsPeerToPeerBits = kAcsRequestRedirect | kAcsCompletionRedirect | kAcsEgressControl;

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

  // The kernel log (/dev/kmsg): whether it could be read (root or CAP_SYSLOG; a container
  // usually has none), and the NVIDIA driver's Xid reports in it.
  bool kernel_log_read = false;
  std::vector<gpu::XidEvent> xid_events;

  // The IOMMU. The kernel command line's IOMMU words ("intel_iommu=on", "iommu=pt", …).
  bool kernel_cmdline_read = false;
  std::vector<std::string> iommu_cmdline;
  bool iommu_present = false;  // /sys/class/iommu has entries: an IOMMU is active
  // The IOMMU groups' default domain types (/sys/kernel/iommu_groups/*/type, kernels from
  // 5.11): "identity" is passthrough, "DMA" and "DMA-FQ" translate every DMA address.
  std::vector<std::string> iommu_domain_types;

  // PCI bridges (class 0x0604) and their ACS Control registers. Config space past the first
  // 64 bytes is readable only by root: those bridges are counted as unreadable.
  int pci_bridges = 0;
  int pci_bridges_unreadable = 0;
  std::vector<AcsBridge> acs_redirecting_bridges;  // ACS sends peer-to-peer traffic upstream
};

struct HostProbe {
  std::string root;      // prefix of every probed path: "" on a real host
  std::string path_env;  // PATH, to find mpirun
  std::string shm_path = "/dev/shm";
};

// Reads the facts. Never throws: what cannot be read stays empty or zero.
HostFacts gather_host_facts(const HostProbe& probe);

// The ACS Control register in a PCI function's config space (the bytes of its sysfs `config`
// file, 4096 of them): empty when there is no ACS capability or the space is cut short.
std::optional<uint16_t> acs_control(const std::string& config);

// CPUs in a Linux cpulist: "0-3,8,10-11" has 7; -1 when the text is not one.
int count_cpulist(const std::string& cpulist);

}  // namespace lockstep::tools
