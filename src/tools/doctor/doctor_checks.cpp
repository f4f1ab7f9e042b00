// The parts the rules share: status names, byte formatting, the driver table, and the
// order and selection of the rules.
#include "tools/doctor/doctor_checks.h"

#include <algorithm>
#include <cstdio>

namespace lockstep::tools {

const char* to_string(Status status) {
  switch (status) {
    case Status::kPass:
      return "PASS";
    case Status::kInfo:
      return "INFO";
    case Status::kWarn:
      return "WARN";
    case Status::kFail:
      return "FAIL";
  }
  return "?";
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) text += (i ? separator : "") + parts[i];
  return text;
}

// NVIDIA's CUDA compatibility guide (minor-version compatibility table, Linux x86_64):
// any 11.x runs on 450.80.02 or newer, any 12.x on 525.60.13, any 13.x on 580.
std::string minimum_driver_for_cuda_major(int major) {
  switch (major) {
    case 11:
      return "450.80.02";
    case 12:
      return "525.60.13";
    case 13:
      return "580";
    default:
      return "";
  }
}

CudaSupport cuda_support(int driver_cuda, int built_for) {
  if (driver_cuda >= built_for) return CudaSupport::kFull;
  if (driver_cuda / 1000 == built_for / 1000) return CudaSupport::kMinorVersionCompatibility;
  return CudaSupport::kNeedsNewerDriver;
}

std::vector<Check> run_checks(const DoctorInput& in) {
  std::vector<Check> checks = {check_nvml(in), check_gpus_seen(in), check_driver_vs_cuda_runtime(in),
                               check_driver_vs_nccl(in)};
  if (in.gpus.loaded() && !in.gpus.devices.empty()) {
    for (auto rule : {check_visible_devices, check_other_processes, check_gpu_leases, check_ecc, check_retired_pages,
                      check_row_remapping, check_throttling, check_persistence, check_topology, check_pcie_link,
                      check_nvlink_errors, check_fabric_manager}) {
      checks.push_back(rule(in));
    }
  }
  // --deep: the probes' results, also where no GPU or no CUDA device was found (skipped, never a pass).
  if (in.deep) {
    checks.push_back(check_peer_copies(in));
    checks.push_back(check_gemm_burn(in));
  }
  for (auto rule : {check_xid, check_iommu_acs, check_shm, check_memlock, check_cores, check_mpi})
    checks.push_back(rule(in));
  for (Check& check : check_python_stack(in)) checks.push_back(std::move(check));
  if (in.job) checks.push_back(check_job_environment(in));
  return checks;
}

int exit_code(const std::vector<Check>& checks) {
  int code = 0;
  for (const Check& check : checks) {
    if (check.status == Status::kFail) code = 2;
    if (check.status == Status::kWarn) code = std::max(code, 1);
  }
  return code;
}

}  // namespace lockstep::tools
