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

// `lockstep doctor --deep`: what running the GPUs measured (doctor_deep_probes.cpp runs the
// probes; the rules below judge these plain results, so they are tested on results built by
// hand). A probe either finished, hung (it did not finish within its deadline: doctor
// stopped waiting for it and ran nothing after it), or was not run (an earlier one hung).
enum class ProbeOutcome { kFinished, kHung, kNotRun };

// One ordered pair of GPUs: a buffer of a known pattern copied from cuda:src to cuda:dst
// (peer to peer), timed, then read back from the destination and compared byte for byte.
struct PeerCopyResult {
  int src = 0, dst = 0;                      // the devices cuda:src and cuda:dst
  std::optional<unsigned> src_gpu, dst_gpu;  // their NVML indices (nvidia-smi's), when known
  std::string link;    // the pair's link as nvidia-smi topo -m names it ("NV12", "SYS"); "" unknown
  uint64_t bytes = 0;  // the buffer's size
  int repeats = 0;     // copies timed
  double seconds = 0;  // their time, synchronized
  double gbps = 0;     // bytes * repeats / seconds, in GB/s (10^9 bytes)
  ProbeOutcome outcome = ProbeOutcome::kFinished;
  uint64_t mismatches = 0;      // bytes on the destination that differ from the pattern
  uint64_t first_mismatch = 0;  // the offset of the first of them
  bool zeros = false;           // the destination read back all zeros
  std::string error;            // the error the copy raised ("" when none)
  bool ok() const { return outcome == ProbeOutcome::kFinished && error.empty() && mismatches == 0; }
};

// One GPU's GEMM burn: n x n products through matmul for about a second, timed, the last
// product's sub-blocks checked against a CPU reference.
struct GemmBurnResult {
  int device = 0;               // cuda:device
  std::optional<unsigned> gpu;  // its NVML index, when known
  std::string name;             // the GPU's model ("NVIDIA H100 80GB HBM3"); "" unknown
  std::string dtype;            // what the products read: "bf16" (autocast), "f32"
  int64_t n = 0;
  int iterations = 0;
  double seconds = 0;
  double tflops = 0;  // 2 n^3 * iterations / seconds / 10^12
  ProbeOutcome outcome = ProbeOutcome::kFinished;
  int64_t checked = 0;      // elements compared with the CPU reference
  int64_t wrong = 0;        // of them, outside the tolerance
  std::string first_wrong;  // "C[3, 17] = 0 (expected 12.5)"
  std::string error;
  bool ok() const { return outcome == ProbeOutcome::kFinished && error.empty() && wrong == 0; }
};

struct DeepProbes {
  int gpus = 0;                  // the distinct GPUs CUDA sees (logical devices sharing one count once)
  int devices_per_gpu = 1;       // LOCKSTEP_CUDA_DEVICES_PER_GPU: cuda:N runs on CUDA's GPU N / this
  std::string no_device_reason;  // why CUDA sees none
  std::vector<PeerCopyResult> copies;
  std::vector<GemmBurnResult> burns;
  std::string error;           // a failure outside any one probe (the probes could not start)
  std::string stopped;         // why the later probes did not run ("the copy cuda:0 → cuda:1 hung"); "" when all ran
  double timeout_seconds = 0;  // each probe's deadline
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
  // --deep: what running the GPUs measured; empty without --deep (no deep checks).
  std::optional<DeepProbes> deep;
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
// --deep (doctor_deep_checks.cpp): the GPU-to-GPU copy matrix and the per-GPU GEMM burn.
Check check_peer_copies(const DoctorInput& in);
Check check_gemm_burn(const DoctorInput& in);
// Names the probed devices as NVML does (index, model, the pairs' links), from CUDA's
// numbering of the NVML GPUs (gpu::cuda_devices). Leaves them unnamed when the two
// disagree on how many GPUs there are.
void name_probed_gpus(DeepProbes& deep, const gpu::GpuState& gpus, const std::vector<unsigned>& cuda_to_nvml);
// Thresholds of the deep rules.
inline constexpr double kSlowPairFraction = 0.5;   // a pair below this fraction of its link kind's median: WARN
inline constexpr double kSlowGemmFraction = 0.85;  // a GPU below this fraction of its model's fastest: WARN
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
