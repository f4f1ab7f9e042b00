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

struct DoctorInput {
  gpu::GpuState gpus;
  // The GPUs `lockstep run` jobs lease (gpu/gpu_leases.h): NVML index -> what holds the lease.
  std::map<unsigned, std::string> leases;
  // NVML loaded but a required call failed while reading (Nvml::read threw): its message.
  std::string read_error;
  HostFacts host;
  DoctorEnv env;
  gpu::BuildInfo build;
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
Check check_shm(const DoctorInput& in);
Check check_memlock(const DoctorInput& in);
Check check_cores(const DoctorInput& in);
Check check_mpi(const DoctorInput& in);

// Every rule that applies: the GPU rules only when NVML answered.
std::vector<Check> run_checks(const DoctorInput& in);
// 0 when every check passes (INFO included), 1 with a warning, 2 with a failure.
int exit_code(const std::vector<Check>& checks);

// The oldest Linux driver that runs any CUDA `major`.x under minor-version compatibility
// ("525.60.13" for 12); empty for a major the table does not know.
std::string minimum_driver_for_cuda_major(int major);
// Thresholds of the host rules.
inline constexpr uint64_t kShmWarnBytes = uint64_t{1} << 30;       // below: WARN
inline constexpr uint64_t kShmFailBytes = uint64_t{256} << 20;     // below: FAIL (docker's 64 MiB is)
inline constexpr uint64_t kMemlockWarnBytes = uint64_t{64} << 20;  // below (and not unlimited): WARN

}  // namespace lockstep::tools
