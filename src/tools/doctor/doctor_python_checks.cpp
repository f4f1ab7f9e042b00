// The rules about the user's Python stack: each interpreter that will run the job, and each
// framework installed in it (torch, tensorflow, jax) against this host's driver by CUDA's
// compatibility rules, with the package to install when they do not match.
#include <algorithm>
#include <set>

#include "tools/doctor/doctor_checks.h"
#include "tools/doctor/framework_builds.h"

namespace lockstep::tools {
namespace {

void escalate(Check& c, Status status) { c.status = std::max(c.status, status); }

// The GPUs this host has, as NVML or the driver's own files show them.
size_t host_gpus(const DoctorInput& in) {
  return std::max({in.gpus.devices.size(), in.host.driver_gpus.size(), in.host.device_nodes.size()});
}

// How to install into this interpreter: its own pip, or, where the distribution manages
// the Python (PEP 668, Debian's python3), a virtualenv made from it.
std::string pip_install(const PythonFacts& python) {
  if (python.externally_managed) {
    return python.interpreter + " -m venv ~/venv && ~/venv/bin/python -m pip install";
  }
  return python.interpreter + " -m pip install";
}

// What the framework was built with, for the details.
std::string build_line(const FrameworkFacts& f) {
  std::vector<std::string> parts;
  if (!f.cuda.empty()) parts.push_back("CUDA " + f.cuda);
  if (!f.rocm.empty()) parts.push_back("ROCm (HIP) " + f.rocm);
  if (!f.cudnn.empty()) parts.push_back("cuDNN " + f.cudnn);
  if (!f.nccl.empty()) parts.push_back("NCCL " + f.nccl);
  return parts.empty() ? "built without CUDA (a CPU build)" : "built with " + join(parts, ", ");
}

// NCCLs in one process that disagree: the framework's own (as it reports it) and every
// libnccl the import mapped. Two of them mean one framework runs another's NCCL.
void check_one_nccl(const FrameworkFacts& f, Check& c) {
  std::set<std::string> versions;
  if (!f.nccl.empty()) versions.insert(f.nccl);
  std::set<std::string> paths;
  for (const LoadedNccl& library : f.loaded_nccl) {
    paths.insert(library.path);
    if (!library.version.empty()) versions.insert(library.version);
  }
  for (const LoadedNccl& library : f.loaded_nccl) {
    c.details.push_back("loaded " + library.path + (library.version.empty() ? "" : " (NCCL " + library.version + ")"));
  }
  if (versions.size() < 2 && paths.size() < 2) return;
  escalate(c, versions.size() >= 2 ? Status::kFail : Status::kWarn);
  std::vector<std::string> seen;
  if (!f.nccl.empty()) seen.push_back(f.name + " reports NCCL " + f.nccl);
  for (const LoadedNccl& library : f.loaded_nccl) {
    seen.push_back(library.path + (library.version.empty() ? "" : " is " + library.version));
  }
  c.summary += "; two NCCLs in one process (" + join(seen, ", ") +
               "): collectives run whichever the loader found first, and ranks may disagree on the protocol";
  if (c.fix.empty()) {
    c.fix = "let " + f.name + " use its own NCCL: take the other libnccl out of LD_PRELOAD and LD_LIBRARY_PATH" +
            (f.nccl.empty() ? std::string()
                            : " (or install nvidia-nccl-cu" + f.cuda.substr(0, f.cuda.find('.')) + "==" + f.nccl + ")");
  }
}

Check check_framework(const DoctorInput& in, const PythonFacts& python, const FrameworkFacts& f, bool name_python) {
  Check c{f.name, Status::kPass, "", "", {}};
  const std::string where = name_python ? python.interpreter + ": " : "";
  const std::string label = f.name + (f.version.empty() ? "" : " " + f.version);
  const size_t gpus = host_gpus(in);
  const int driver_cuda = in.gpus.loaded() ? in.gpus.cuda_driver_version : 0;
  const std::string cuda_fix = cuda_build_fix(f.name, f.version, driver_cuda, pip_install(python));
  c.details.push_back(build_line(f) + (f.location.empty() ? "" : ", from " + f.location));
  for (const auto& [wheel, version] : f.wheels) c.details.push_back("wheel " + wheel + " " + version);
  for (const std::string& said : f.warnings) c.details.push_back("said: " + said);

  if (!f.import_error.empty()) {
    c.status = Status::kFail;
    c.summary = where + label + " is installed, but " +
                (f.import_error.rfind("importing", 0) == 0 ? f.import_error : "importing it fails: " + f.import_error);
    const bool missing_library = f.import_error.find(".so") != std::string::npos;
    c.fix = missing_library ? "a library it links is missing or another version: reinstall it with its CUDA wheels (" +
                                  pip_install(python) + " --force-reinstall " + f.name +
                                  (f.version.empty() ? "" : "==" + f.version.substr(0, f.version.find('+'))) +
                                  ") and check LD_LIBRARY_PATH"
                            : "run " + python.interpreter + " -c 'import " + f.name + "' to see the whole error";
    return c;
  }
  if (!f.rocm.empty() && f.cuda.empty()) {
    c.status = gpus > 0 ? Status::kFail : Status::kInfo;
    c.summary = where + label + " is a ROCm build, for AMD GPUs" +
                (gpus > 0 ? ": it cannot use this host's NVIDIA GPUs" : "; this host has no NVIDIA GPU");
    c.fix = cuda_fix;
    return c;
  }
  if (f.cuda.empty()) {
    if (gpus > 0) {
      c.status = Status::kFail;
      c.summary = where + label + " is a CPU-only build: it cannot use the " + std::to_string(gpus) + " GPU" +
                  (gpus == 1 ? "" : "s") + " of this host, and trains on the CPU";
      c.fix = cuda_fix;
    } else {
      c.status = Status::kInfo;
      c.summary = where + label +
                  " is a CPU-only build: it trains on the CPU, which is all this host (no GPU) offers; on a GPU "
                  "server it needs a CUDA build";
      c.details.push_back("on a GPU server: " + cuda_fix);
    }
    return c;
  }

  const int built_for = parse_cuda_version(f.cuda);
  if (gpus == 0) {
    c.status = Status::kInfo;
    c.summary = where + label + " is built with CUDA " + f.cuda +
                "; this host has no GPU, so it runs on the CPU (a CUDA build does that too)";
  } else if (driver_cuda == 0) {
    c.status = Status::kWarn;
    c.summary = where + label + " is built with CUDA " + f.cuda +
                ", but the driver's CUDA version is unknown (NVML did not answer): it cannot be checked";
    c.fix = "see the nvml check above";
  } else {
    const std::string driver =
        "driver " + in.gpus.driver_version + " supports CUDA " + gpu::cuda_version_string(driver_cuda);
    switch (cuda_support(driver_cuda, built_for)) {
      case CudaSupport::kFull:
        c.summary = where + label + " is built with CUDA " + f.cuda + "; " + driver;
        break;
      case CudaSupport::kMinorVersionCompatibility:
        c.status = Status::kWarn;
        c.summary = where + label + " is built with CUDA " + f.cuda + ", newer than the " + driver +
                    ": it runs under minor-version compatibility, but kernels shipped as PTX only cannot be "
                    "JIT-compiled and features new in " +
                    f.cuda + " are missing";
        c.fix = cuda_fix;
        break;
      case CudaSupport::kNeedsNewerDriver: {
        c.status = Status::kFail;
        const std::string minimum = minimum_driver_for_cuda_major(built_for / 1000);
        c.summary = where + label + " is built with CUDA " + f.cuda + ", but " + driver +
                    ": it needs a driver for CUDA " + std::to_string(built_for / 1000) + ".x" +
                    (minimum.empty() ? "" : " (" + minimum + " or newer)") + ", and finds no GPU";
        c.fix = cuda_fix;
        break;
      }
    }
    if (f.gpu_usable.has_value()) {
      if (*f.gpu_usable) {
        c.summary += "; it sees " + std::to_string(f.gpu_count) + " GPU" + (f.gpu_count == 1 ? "" : "s");
      } else if (c.status != Status::kFail) {
        escalate(c, Status::kFail);
        const auto visible = in.env.cuda_visible_devices;
        c.summary +=
            "; yet it finds no usable GPU" + (f.warnings.empty() ? std::string() : " (" + f.warnings.front() + ")");
        c.fix = visible ? "CUDA_VISIBLE_DEVICES is '" + *visible + "': see the visible-devices check"
                        : "run " + python.interpreter + " -c 'import " + f.name +
                              "' and look for the CUDA error; check that /dev/nvidia* are readable";
      }
    }
  }
  if (!f.cudnn_error.empty()) {
    escalate(c, Status::kFail);
    c.summary += "; cuDNN: " + f.cudnn_error;
    if (c.fix.empty() || c.status == Status::kFail) {
      c.fix = "use the cuDNN " + f.name + " was built with: take other cuDNN folders out of LD_LIBRARY_PATH, or " +
              pip_install(python) + " --force-reinstall nvidia-cudnn-cu" + f.cuda.substr(0, f.cuda.find('.'));
    }
  }
  check_one_nccl(f, c);
  return c;
}

}  // namespace

std::vector<Check> check_python_stack(const DoctorInput& in) {
  std::vector<Check> checks;
  const bool several = in.pythons.size() > 1;
  if (in.pythons.empty() && in.job) {
    checks.push_back({"python",
                      Status::kInfo,
                      "no Python to check: " + (in.job->interpreter_why.empty() ? std::string("the command runs none")
                                                                                : in.job->interpreter_why),
                      "",
                      {}});
  }
  for (const PythonFacts& python : in.pythons) {
    Check c{"python", Status::kPass, "", "", {}};
    if (!python.probe_error.empty()) {
      c.status = Status::kFail;
      c.summary = python.interpreter + " (" + python.origin + ") cannot be asked: " + python.probe_error;
      c.fix = "check that " + python.interpreter + " runs (" + python.interpreter +
              " -c 'print(1)'), or name another with --python";
      checks.push_back(c);
      continue;
    }
    std::vector<std::string> installed, missing;
    for (const FrameworkFacts& f : python.frameworks) {
      (f.installed ? installed : missing)
          .push_back(f.installed && !f.version.empty() ? f.name + " " + f.version : f.name);
    }
    c.summary =
        python.interpreter + " (" + python.origin + "): Python " + python.version + " at " + python.prefix +
        (python.environment == "system" ? "" : ", a " + python.environment + " environment") +
        (python.externally_managed ? ", the distribution's own (its pip refuses to install: PEP 668)" : "") + "; " +
        (installed.empty()
             ? "none of torch, tensorflow, jax is installed"
             : join(installed, ", ") + " installed" + (missing.empty() ? "" : " (" + join(missing, ", ") + " not)"));
    if (installed.empty()) c.status = Status::kInfo;
    checks.push_back(c);
    for (const FrameworkFacts& f : python.frameworks) {
      if (f.installed) checks.push_back(check_framework(in, python, f, several));
    }
  }
  return checks;
}

}  // namespace lockstep::tools
