// `lockstep doctor`: is this machine ready to train? Reads the GPUs through NVML, the host's
// facts and the environment, runs the rules of doctor_checks.h, and prints one line per
// check (the fix below each WARN and FAIL) or, with --json, an object for machines.
// Exit code: 0 all pass, 1 warnings, 2 failures.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "lockstep/core/error.h"
#include "lockstep/gpu/build_info.h"
#include "lockstep/gpu/gpu_leases.h"
#include "lockstep/gpu/nvml.h"
#include "tools/common/commands.h"
#include "tools/common/flags.h"
#include "tools/doctor/doctor_checks.h"
#include "tools/doctor/host_facts.h"

namespace lockstep::tools {
namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
}

nlohmann::json facts_json(const DoctorInput& in) {
  nlohmann::json gpus = {{"library", in.gpus.library_path},
                         {"load_error", in.gpus.load_error},
                         {"driver_version", in.gpus.driver_version},
                         {"cuda_driver_version", gpu::cuda_version_string(in.gpus.cuda_driver_version)},
                         {"devices", nlohmann::json::array()}};
  for (const auto& d : in.gpus.devices) {
    gpus["devices"].push_back({{"index", d.index},
                               {"name", d.name},
                               {"uuid", d.uuid},
                               {"pci_bus_id", d.pci_bus_id},
                               {"memory_total_bytes", d.memory_total},
                               {"memory_used_bytes", d.memory_used}});
  }
  const HostFacts& h = in.host;
  nlohmann::json numa = nlohmann::json::array();
  for (const NumaNode& node : h.numa_nodes) numa.push_back({{"id", node.id}, {"cpulist", node.cpulist}});
  nlohmann::json driver_gpus = nlohmann::json::array();
  for (const DriverGpu& g : h.driver_gpus) driver_gpus.push_back({{"pci_bus_id", g.pci_bus_id}, {"model", g.model}});
  nlohmann::json host = {{"shm_present", h.shm_present},
                         {"shm_total_bytes", h.shm_total_bytes},
                         {"shm_free_bytes", h.shm_free_bytes},
                         {"memlock_bytes", h.memlock_bytes ? nlohmann::json(*h.memlock_bytes) : nlohmann::json()},
                         {"cores_online", h.cores_online},
                         {"cores_allowed", h.cores_allowed},
                         {"numa_nodes", numa},
                         {"infiniband_devices", h.infiniband_devices},
                         {"mpirun", h.mpirun_path},
                         {"driver_module_version", h.driver_module_version},
                         {"driver_gpus", driver_gpus},
                         {"device_nodes", h.device_nodes}};
  nlohmann::json build = {{"cuda_runtime", gpu::cuda_version_string(in.build.cuda_runtime_version)},
                          {"nccl", gpu::nccl_version_string(in.build.nccl_version)},
                          {"mpi_backend", in.build.mpi}};
  return {{"gpus", gpus}, {"host", host}, {"build", build}};
}

std::string lowercase(const char* text) {
  std::string s = text;
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

void print_report(const std::vector<Check>& checks) {
  size_t width = 0;
  for (const Check& c : checks) width = std::max(width, c.name.size());
  for (const Check& c : checks) {
    std::printf("%s  %-*s  %s\n", to_string(c.status), static_cast<int>(width), c.name.c_str(), c.summary.c_str());
    const std::string indent(6 + width + 2, ' ');
    if ((c.status == Status::kWarn || c.status == Status::kFail) && !c.fix.empty()) {
      std::printf("%sfix: %s\n", indent.c_str(), c.fix.c_str());
    }
    for (const std::string& line : c.details) std::printf("%s%s\n", line.empty() ? "" : indent.c_str(), line.c_str());
  }
  int counts[4] = {};
  for (const Check& c : checks) ++counts[static_cast<int>(c.status)];
  std::printf("\n%d passed, %d info, %d warning%s, %d failure%s\n", counts[0], counts[1], counts[2],
              counts[2] == 1 ? "" : "s", counts[3], counts[3] == 1 ? "" : "s");
}

}  // namespace

int doctor_main(const std::vector<std::string>& args) {
  bool json = false;
  Flags flags("lockstep doctor",
              "Checks whether this machine is ready to train: the GPUs and their driver, CUDA and NCCL versions,\n"
              "CUDA_VISIBLE_DEVICES, other users' processes, GPU health, topology, /dev/shm, locked memory, cores,\n"
              "NUMA and MPI. Exit code 0: all pass; 1: warnings; 2: failures.");
  flags.add_switch("json", &json, "print one JSON object (the checks and the facts) instead of the report");
  if (!flags.parse(args)) return 0;

  DoctorInput in;
  {
    gpu::Nvml nvml;
    try {
      in.gpus = nvml.read({.processes = true, .topology = true});
    } catch (const Error& e) {
      // A required call failed: the report says so instead of stopping at the error.
      in.gpus.library_path = nvml.library_path();
      in.read_error = e.what();
    }
  }
  in.leases = gpu::leased_gpus(in.gpus);
  HostProbe probe;
  probe.path_env = env("PATH").value_or("");
  in.host = gather_host_facts(probe);
  in.env.cuda_visible_devices = env("CUDA_VISIBLE_DEVICES");
  in.env.cuda_device_order = env("CUDA_DEVICE_ORDER");
  in.env.shm_staging_bytes = env("LOCKSTEP_SHM_STAGING_BYTES");
  in.env.uid = getuid();
  in.build = gpu::build_info();

  const std::vector<Check> checks = run_checks(in);
  const int code = exit_code(checks);
  if (json) {
    nlohmann::json out = {{"checks", nlohmann::json::array()}, {"facts", facts_json(in)}, {"exit_code", code}};
    for (const Check& c : checks) {
      out["checks"].push_back({{"name", c.name},
                               {"status", lowercase(to_string(c.status))},
                               {"summary", c.summary},
                               {"fix", c.fix},
                               {"details", c.details}});
    }
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    print_report(checks);
  }
  return code;
}

}  // namespace lockstep::tools
