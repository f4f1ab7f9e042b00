// `lockstep doctor`: is this machine ready to train? Reads the GPUs through NVML, the host's
// facts and the environment, runs the rules of doctor_checks.h, and prints one line per
// check (the fix below each WARN and FAIL) or, with --json, an object for machines.
// With `-- CMD` it checks the Python interpreter CMD runs and its environment variables.
// Exit code: 0 all pass, 1 warnings, 2 failures.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

#include "lockstep/core/error.h"
#include "lockstep/gpu/build_info.h"
#include "lockstep/gpu/device_order.h"
#include "lockstep/gpu/gpu_leases.h"
#include "lockstep/gpu/nvml.h"
#include "tools/common/commands.h"
#include "tools/common/duration.h"
#include "tools/common/flags.h"
#include "tools/doctor/doctor_checks.h"
#include "tools/doctor/doctor_deep_probes.h"
#include "tools/doctor/host_facts.h"
#include "tools/doctor/python_stack.h"

namespace lockstep::tools {
namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
}

nlohmann::json python_json(const std::vector<PythonFacts>& pythons) {
  nlohmann::json out = nlohmann::json::array();
  for (const PythonFacts& p : pythons) {
    nlohmann::json frameworks = nlohmann::json::array();
    for (const FrameworkFacts& f : p.frameworks) {
      nlohmann::json loaded = nlohmann::json::array();
      for (const LoadedNccl& library : f.loaded_nccl) {
        loaded.push_back({{"path", library.path}, {"version", library.version}});
      }
      frameworks.push_back({{"name", f.name},
                            {"installed", f.installed},
                            {"version", f.version},
                            {"location", f.location},
                            {"import_error", f.import_error},
                            {"cuda", f.cuda},
                            {"rocm", f.rocm},
                            {"cudnn", f.cudnn},
                            {"cudnn_error", f.cudnn_error},
                            {"nccl", f.nccl},
                            {"nccl_error", f.nccl_error},
                            {"gpu_usable", f.gpu_usable ? nlohmann::json(*f.gpu_usable) : nlohmann::json()},
                            {"gpu_count", f.gpu_count},
                            {"warnings", f.warnings},
                            {"loaded_nccl", loaded},
                            {"wheels", f.wheels}});
    }
    out.push_back({{"interpreter", p.interpreter},
                   {"origin", p.origin},
                   {"probe_error", p.probe_error},
                   {"version", p.version},
                   {"prefix", p.prefix},
                   {"environment", p.environment},
                   {"externally_managed", p.externally_managed},
                   {"frameworks", frameworks}});
  }
  return out;
}

// doctor's environment as the command's `env` words change it.
std::map<std::string, std::string> job_variables(const EnvPrefix& command_env) {
  std::map<std::string, std::string> vars;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const size_t equals = text.find('=');
    if (equals != std::string::npos) vars[text.substr(0, equals)] = text.substr(equals + 1);
  }
  for (const std::string& name : command_env.unset) vars.erase(name);
  for (const auto& [name, value] : command_env.assigned) vars[name] = value;
  return vars;
}

std::optional<std::string> lookup(const std::map<std::string, std::string>& vars, const std::string& name) {
  const auto it = vars.find(name);
  return it != vars.end() ? std::optional<std::string>(it->second) : std::nullopt;
}

const char* outcome_name(ProbeOutcome outcome) {
  switch (outcome) {
    case ProbeOutcome::kFinished:
      return "finished";
    case ProbeOutcome::kHung:
      return "hung";
    case ProbeOutcome::kNotRun:
      return "not_run";
  }
  return "?";
}

nlohmann::json optional_index(const std::optional<unsigned>& index) {
  return index ? nlohmann::json(*index) : nlohmann::json();
}

// --deep's measurements, per pair and per GPU (null without --deep).
nlohmann::json deep_json(const std::optional<DeepProbes>& deep) {
  if (!deep) return nullptr;
  nlohmann::json copies = nlohmann::json::array(), burns = nlohmann::json::array();
  for (const PeerCopyResult& r : deep->copies) {
    copies.push_back({{"src", std::string("cuda:") + std::to_string(r.src)},
                      {"dst", std::string("cuda:") + std::to_string(r.dst)},
                      {"src_gpu", optional_index(r.src_gpu)},
                      {"dst_gpu", optional_index(r.dst_gpu)},
                      {"link", r.link},
                      {"bytes", r.bytes},
                      {"repeats", r.repeats},
                      {"seconds", r.seconds},
                      {"gb_per_s", r.gbps},
                      {"outcome", outcome_name(r.outcome)},
                      {"ok", r.ok()},
                      {"mismatches", r.mismatches},
                      {"first_mismatch", r.mismatches ? nlohmann::json(r.first_mismatch) : nlohmann::json()},
                      {"zeros", r.zeros},
                      {"error", r.error}});
  }
  for (const GemmBurnResult& r : deep->burns) {
    burns.push_back({{"device", std::string("cuda:") + std::to_string(r.device)},
                     {"gpu", optional_index(r.gpu)},
                     {"name", r.name},
                     {"dtype", r.dtype},
                     {"n", r.n},
                     {"iterations", r.iterations},
                     {"seconds", r.seconds},
                     {"tflops", r.tflops},
                     {"outcome", outcome_name(r.outcome)},
                     {"ok", r.ok()},
                     {"checked", r.checked},
                     {"wrong", r.wrong},
                     {"first_wrong", r.first_wrong},
                     {"error", r.error}});
  }
  return {{"gpus", deep->gpus},
          {"no_device_reason", deep->no_device_reason},
          {"timeout_seconds", deep->timeout_seconds},
          {"error", deep->error},
          {"stopped", deep->stopped},
          {"copies", copies},
          {"burns", burns}};
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
  nlohmann::json xids = nlohmann::json::array();
  for (const gpu::XidEvent& e : h.xid_events) {
    xids.push_back({{"pci_bus_id", e.pci_bus_id}, {"xid", e.xid}, {"message", e.message}});
  }
  nlohmann::json acs = nlohmann::json::array();
  for (const AcsBridge& b : h.acs_redirecting_bridges) acs.push_back({{"bdf", b.bdf}, {"acs_control", b.control}});
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
                         {"device_nodes", h.device_nodes},
                         {"kernel_log_read", h.kernel_log_read},
                         {"xid_events", xids},
                         {"kernel_cmdline_read", h.kernel_cmdline_read},
                         {"iommu_cmdline", h.iommu_cmdline},
                         {"iommu_present", h.iommu_present},
                         {"iommu_domain_types", h.iommu_domain_types},
                         {"pci_bridges", h.pci_bridges},
                         {"pci_bridges_unreadable", h.pci_bridges_unreadable},
                         {"acs_redirecting_bridges", acs}};
  nlohmann::json build = {{"cuda_runtime", gpu::cuda_version_string(in.build.cuda_runtime_version)},
                          {"nccl", gpu::nccl_version_string(in.build.nccl_version)},
                          {"mpi_backend", in.build.mpi}};
  return {{"gpus", gpus},
          {"host", host},
          {"build", build},
          {"python", python_json(in.pythons)},
          {"deep", deep_json(in.deep)}};
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
  // Options, then the job to check after "--".
  const auto dashes = std::find(args.begin(), args.end(), "--");
  const std::vector<std::string> options(args.begin(), dashes);
  std::vector<std::string> command;
  if (dashes != args.end()) command.assign(dashes + 1, args.end());

  bool json = false, no_python = false, deep = false;
  std::string deep_timeout = "20s";
  // Importing TensorFlow from a cold disk takes seconds; an import that takes this long hangs.
  std::string python, python_timeout = "30s";
  Flags flags("lockstep doctor",
              "Checks whether this machine is ready to train: the GPUs and their driver, CUDA and NCCL versions,\n"
              "CUDA_VISIBLE_DEVICES, other users' processes, GPU health, topology, /dev/shm, locked memory, cores,\n"
              "NUMA, MPI, and the Python stack that will run the job: torch, tensorflow and jax in python3 on PATH\n"
              "and the active virtualenv or conda environment, their CUDA, cuDNN and NCCL against the driver.\n"
              "`lockstep doctor [options] -- CMD ...` checks the interpreter CMD runs and the environment variables\n"
              "that change how it uses the GPUs. --deep also runs the GPUs for a few seconds (about one per GPU, plus\n"
              "the copies): every pair's peer copy checked byte for byte and timed, and a GEMM burn per GPU.\n"
              "Exit code 0: all pass; 1: warnings; 2: failures.");
  flags.add_switch("json", &json, "print one JSON object (the checks and the facts) instead of the report");
  flags.add("python", &python, "check this Python interpreter (a path, or a name on PATH) instead of the ones found");
  flags.add("python-timeout", &python_timeout, "how long each interpreter may take to import a framework");
  flags.add_switch("deep", &deep,
                   "run the GPUs for a few seconds: a peer copy between every ordered pair of GPUs, checked byte for "
                   "byte and timed, and a GEMM burn on each GPU (TFLOP/s, checked against the CPU)");
  flags.add("deep-timeout", &deep_timeout, "how long each --deep probe may take before it counts as a hang");
  flags.add_switch("no-python", &no_python,
                   "skip the Python checks (each interpreter takes seconds to import its frameworks)");
  if (!flags.parse(options)) return 0;
  const auto probe_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(parse_duration("--python-timeout", python_timeout) * 1000));
  const auto deep_limit =
      std::chrono::milliseconds(static_cast<int64_t>(parse_duration("--deep-timeout", deep_timeout) * 1000));
  if (dashes != args.end() && command.empty())
    throw UsageError("nothing after '--': name the job to check, e.g. -- python3 train.py");
  if (no_python && !python.empty())
    throw UsageError("--no-python skips the interpreter --python names: give one or the other");

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
  PythonSources sources;
  sources.path_env = probe.path_env;
  sources.virtual_env = env("VIRTUAL_ENV").value_or("");
  sources.conda_prefix = env("CONDA_PREFIX").value_or("");
  if (!python.empty()) sources.explicit_pythons.push_back(python);
  sources.command = command;
  const EnvPrefix command_env = env_prefix(command);
  if (!command.empty()) {
    in.job = JobCommand{command, "", job_variables(command_env)};
    command_interpreter(command, sources.path_env, &in.job->interpreter_why);
    // The GPUs the command will see are the ones its own environment names.
    in.env.cuda_visible_devices = lookup(in.job->variables, "CUDA_VISIBLE_DEVICES");
    in.env.cuda_device_order = lookup(in.job->variables, "CUDA_DEVICE_ORDER");
  }
  if (!no_python) {
    for (const PythonCandidate& candidate : python_candidates(sources)) {
      in.pythons.push_back(probe_python(candidate, probe_timeout, command_env.assigned));
    }
  }

  if (deep) {
    in.deep = run_deep_probes({.timeout = deep_limit});
    // The probes ran in this process: its own CUDA_VISIBLE_DEVICES numbers the GPUs, not the job's.
    if (in.gpus.loaded()) name_probed_gpus(*in.deep, in.gpus, gpu::cuda_devices_from_environment(in.gpus).visible);
  }

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
  if (in.deep && !in.deep->stopped.empty()) {
    // A probe hung in the driver and its thread is still blocked there: exiting normally would
    // run the CUDA library's teardown against it. The report is out; leave at once.
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }
  return code;
}

}  // namespace lockstep::tools
