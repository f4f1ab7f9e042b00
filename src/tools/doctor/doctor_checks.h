// The rules of `lockstep doctor`: each is a pure function from what was read (the GPUs,
// the host, the environment, this build) to one Check, so every rule is unit-tested with
// states built by hand. doctor.cpp gathers the inputs and prints the checks.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/gpu/build_info.h"
#include "lockstep/gpu/gpu_state.h"
#include "tools/common/byte_size.h"
#include "tools/doctor/host_facts.h"
#include "tools/doctor/python_stack.h"

namespace lockstep::tools {

// INFO is a fact worth showing that needs nothing done; it counts as a pass.
enum class Status { kPass, kInfo, kWarn, kFail };
const char* to_string(Status status);  // "PASS", "INFO", "WARN", "FAIL"

struct Check {
  std::string name;  // "driver-vs-cuda-runtime"
  Status status = Status::kPass;
  std::string summary;               // one line
  std::string fix;                   // one line, for WARN and FAIL
  std::vector<std::string> details;  // further lines: per-GPU findings, the topology matrix
};

// The environment variables the rules read; empty optionals are unset variables.
struct DoctorEnv {
  std::optional<std::string> cuda_visible_devices;
  std::optional<std::string> cuda_device_order;
  std::optional<std::string> shm_staging_bytes;  // LOCKSTEP_SHM_STAGING_BYTES
  uid_t uid = 0;                                 // whose processes are "ours"
};

// `lockstep doctor -- CMD`: the job it was asked about.
struct JobCommand {
  std::vector<std::string> command;
  std::string interpreter_why;  // how its interpreter was found, or why none was
  // Every variable of doctor's environment and the command's own `env NAME=VALUE` words
  // (these win), by name.
  std::map<std::string, std::string> variables;
};

struct DoctorInput {
  gpu::GpuState gpus;
  // The GPUs `lockstep run` jobs lease (gpu/gpu_leases.h): NVML index -> what holds the lease.
  std::map<unsigned, std::string> leases;
  // NVML loaded but a required call failed while reading (Nvml::read threw): its message.
  std::string read_error;
  HostFacts host;
  DoctorEnv env;
  gpu::BuildInfo build;
  // The Python interpreters that will run the job, probed (empty with --no-python).
  std::vector<PythonFacts> pythons;
  std::optional<JobCommand> job;
};

// The rules, in the order the report lists them.
Check check_nvml(const DoctorInput& in);
Check check_gpus_seen(const DoctorInput& in);
Check check_driver_vs_cuda_runtime(const DoctorInput& in);
Check check_driver_vs_nccl(const DoctorInput& in);
Check check_visible_devices(const DoctorInput& in);
Check check_other_processes(const DoctorInput& in);
Check check_gpu_leases(const DoctorInput& in);
Check check_ecc(const DoctorInput& in);
Check check_retired_pages(const DoctorInput& in);
Check check_row_remapping(const DoctorInput& in);
Check check_throttling(const DoctorInput& in);
Check check_persistence(const DoctorInput& in);
Check check_topology(const DoctorInput& in);
// How the GPUs are connected (doctor_link_checks.cpp): PCIe links against their maxima,
// NVLink error counters, the NVSwitch fabric manager.
Check check_pcie_link(const DoctorInput& in);
Check check_nvlink_errors(const DoctorInput& in);
Check check_fabric_manager(const DoctorInput& in);
Check check_xid(const DoctorInput& in);        // the driver's Xid reports in the kernel log
Check check_iommu_acs(const DoctorInput& in);  // IOMMU translation and PCIe ACS against GPU peer-to-peer
Check check_shm(const DoctorInput& in);
Check check_memlock(const DoctorInput& in);
Check check_cores(const DoctorInput& in);
Check check_mpi(const DoctorInput& in);

// The user's Python stack: per interpreter one `python` check, then one per installed
// framework (doctor_python_checks.cpp).
std::vector<Check> check_python_stack(const DoctorInput& in);
// With a command: the variables that change how its framework uses the GPUs, and what each does.
Check check_job_environment(const DoctorInput& in);

// Every rule that applies: the GPU rules only when NVML answered.
std::vector<Check> run_checks(const DoctorInput& in);
// 0 when every check passes (INFO included), 1 with a warning, 2 with a failure.
int exit_code(const std::vector<Check>& checks);

// How a driver for CUDA `driver_cuda` runs code built for CUDA `built_for` (1000 * major +
// 10 * minor), by CUDA's rules: a driver runs every runtime up to its own version;
// minor-version compatibility runs newer minors of the same major (no PTX JIT, no new
// features); an older major cannot run it at all.
enum class CudaSupport { kFull, kMinorVersionCompatibility, kNeedsNewerDriver };
CudaSupport cuda_support(int driver_cuda, int built_for);

// "a, b, c" from {"a", "b", "c"} and ", ": the rules' lists in one line.
std::string join(const std::vector<std::string>& parts, const std::string& separator);
// "GPU 3": how the rules name a GPU (NVML's index, as nvidia-smi numbers it).
std::string gpu_label(const gpu::GpuDevice& d);

// The oldest Linux driver that runs any CUDA `major`.x under minor-version compatibility
// ("525.60.13" for 12); empty for a major the table does not know.
std::string minimum_driver_for_cuda_major(int major);
// Thresholds of the host rules.
inline constexpr uint64_t kShmWarnBytes = uint64_t{1} << 30;       // below: WARN
inline constexpr uint64_t kShmFailBytes = uint64_t{256} << 20;     // below: FAIL (docker's 64 MiB is)
inline constexpr uint64_t kMemlockWarnBytes = uint64_t{64} << 20;  // below (and not unlimited): WARN

}  // namespace lockstep::tools
