// The rules about the driver and the GPUs' health: NVML loaded, every GPU seen, driver vs
// the CUDA runtime and NCCL this build uses, other users' processes, ECC, retired pages,
// remapped rows, throttling, persistence mode.
#include <algorithm>
#include <map>
#include <set>

#include "lockstep/gpu/pci_bus_id.h"
#include "tools/doctor/doctor_checks.h"

namespace lockstep::tools {
namespace {

std::string plural(size_t n, const std::string& word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); }

// The driver's CUDA version against one a component was built for (cuda_support).
Check compare_cuda(const std::string& name, const std::string& what, int built_for, const gpu::GpuState& gpus) {
  Check c{name, Status::kPass, "", "", {}};
  const std::string need = gpu::cuda_version_string(built_for);
  const std::string have = gpu::cuda_version_string(gpus.cuda_driver_version);
  const std::string driver = "driver " + gpus.driver_version + " supports CUDA " + have;
  const int need_major = built_for / 1000;
  const CudaSupport support = cuda_support(gpus.cuda_driver_version, built_for);
  if (support == CudaSupport::kFull) {
    c.summary = driver + ", " + what + " needs " + need;
  } else if (support == CudaSupport::kMinorVersionCompatibility) {
    c.status = Status::kWarn;
    c.summary = driver + ", older than the CUDA " + need + " " + what +
                " was built with: it runs under minor-version compatibility, but PTX built for " + need +
                " cannot be JIT-compiled and features new in " + need + " are missing";
    c.fix = "upgrade the driver to one that supports CUDA " + need + " for full support";
  } else {
    c.status = Status::kFail;
    const std::string minimum = minimum_driver_for_cuda_major(need_major);
    c.summary = driver + ", but " + what + " was built with CUDA " + need + ", which needs a driver for CUDA " +
                std::to_string(need_major) + ".x" + (minimum.empty() ? "" : " (" + minimum + " or newer)");
    c.fix = "upgrade the NVIDIA driver" + (minimum.empty() ? std::string() : " to " + minimum + " or newer") +
            ", or install the cuda-compat-" + std::to_string(need_major) + "-* package (data-center GPUs only)";
  }
  return c;
}

}  // namespace

std::string gpu_label(const gpu::GpuDevice& d) { return "GPU " + std::to_string(d.index); }

Check check_nvml(const DoctorInput& in) {
  const gpu::GpuState& gpus = in.gpus;
  Check c{"nvml", Status::kPass, "", "", {}};
  const size_t driver_gpus = std::max(in.host.driver_gpus.size(), in.host.device_nodes.size());
  if (gpus.loaded() && !in.read_error.empty()) {
    c.status = Status::kFail;
    c.summary = "NVML loaded from " + gpus.library_path + ", but reading the GPUs failed: " + in.read_error;
    c.fix = "run nvidia-smi to see the same failure; look for Xid errors in dmesg, then reset the GPU or reboot";
    return c;
  }
  if (gpus.loaded()) {
    // Optional readings NVML could not give: the blanks in other checks, explained.
    for (const auto& d : gpus.devices) {
      for (const std::string& call : d.unavailable) c.details.push_back(gpu_label(d) + ": " + call);
    }
    c.summary = "NVML loaded from " + gpus.library_path + ": driver " + gpus.driver_version + ", " +
                plural(gpus.devices.size(), "GPU");
    if (gpus.devices.empty() && driver_gpus == 0) {
      c.status = Status::kInfo;
      c.summary += "; Lockstep will use the CPU devices cpu:0 … cpu:" + std::to_string(in.host.cores_allowed - 1);
    }
    return c;
  }
  if (gpus.load_error.find("ismatch") != std::string::npos) {
    c.status = Status::kFail;
    c.summary = "NVML cannot start: " + gpus.load_error + " (the loaded kernel module is " +
                (in.host.driver_module_version.empty() ? "unknown" : in.host.driver_module_version) +
                "; the user-space libraries are another version, as after a driver update)";
    c.fix = "reboot, or reload the nvidia kernel modules so they match the installed libraries";
    return c;
  }
  if (driver_gpus > 0) {
    c.status = Status::kFail;
    c.summary = "the NVIDIA driver's files show " + plural(driver_gpus, "GPU") +
                " but NVML cannot be loaded: " + gpus.load_error;
    c.fix =
        "install the driver's user-space libraries (libnvidia-ml.so.1); in a container, start it with the NVIDIA "
        "container toolkit (docker run --gpus all)";
    return c;
  }
  c.status = Status::kInfo;
  c.summary =
      "no NVIDIA GPU driver on this host (" + gpus.load_error +
      "); Lockstep will use the CPU devices cpu:0 … cpu:" + std::to_string(std::max(1, in.host.cores_allowed) - 1) +
      ", one per usable core";
  return c;
}

Check check_gpus_seen(const DoctorInput& in) {
  Check c{"gpus-seen", Status::kPass, "", "", {}};
  std::set<std::string> seen;
  for (const auto& d : in.gpus.devices) seen.insert(gpu::normalize_pci_bus_id(d.pci_bus_id));
  std::vector<std::string> missing;
  for (const DriverGpu& g : in.host.driver_gpus) {
    if (!seen.count(g.pci_bus_id)) missing.push_back(g.pci_bus_id + (g.model.empty() ? "" : " (" + g.model + ")"));
  }
  for (const auto& d : in.gpus.devices) c.details.push_back(gpu_label(d) + ": " + d.name + ", " + d.pci_bus_id);
  if (in.host.driver_gpus.empty() && in.gpus.devices.empty()) {
    c.status = Status::kInfo;
    c.summary = "no GPU in the driver's files (/proc/driver/nvidia/gpus) or through NVML";
    return c;
  }
  if (missing.empty()) {
    c.summary = "NVML sees " + plural(in.gpus.devices.size(), "GPU") +
                (in.host.driver_gpus.empty() ? " (the driver's files are not readable here)"
                                             : ", every one the driver's files list");
    return c;
  }
  for (const std::string& m : missing) c.details.push_back("in the driver's files, not seen by NVML: " + m);
  // A container given some of the host's GPUs may still show every GPU's /proc folder, but
  // only the device nodes of its own: then the others are simply not ours.
  if (in.gpus.loaded() && !in.host.device_nodes.empty() && in.host.device_nodes.size() == in.gpus.devices.size()) {
    c.status = Status::kInfo;
    c.summary = "NVML sees " + plural(in.gpus.devices.size(), "GPU") + ", one per device node here; " +
                plural(missing.size(), "other GPU") + " of the host are not given to this container";
    return c;
  }
  if (!in.gpus.loaded()) {
    c.status = Status::kFail;
    c.summary = "the driver's files list " + plural(in.host.driver_gpus.size(), "GPU") + " but NVML is not loaded";
    c.fix = "see the nvml check above";
    return c;
  }
  c.status = Status::kFail;
  c.summary = plural(missing.size(), "GPU") + " the driver lists " + (missing.size() == 1 ? "is" : "are") +
              " not seen by NVML: " + join(missing, ", ");
  c.fix = "look for Xid errors in `dmesg` (a GPU that fell off the bus); reset it (nvidia-smi -r) or reboot";
  return c;
}

Check check_driver_vs_cuda_runtime(const DoctorInput& in) {
  if (in.build.cuda_runtime_version == 0) {
    return {"driver-vs-cuda-runtime",
            Status::kInfo,
            "this lockstep was built without CUDA: it reads the GPUs (doctor, top, run --gpus) and trains on CPU "
            "devices",
            "",
            {}};
  }
  if (!in.gpus.loaded() || in.gpus.cuda_driver_version == 0) {
    return {
        "driver-vs-cuda-runtime",
        Status::kInfo,
        "built with CUDA " + gpu::cuda_version_string(in.build.cuda_runtime_version) + "; no driver to compare it with",
        "",
        {}};
  }
  return compare_cuda("driver-vs-cuda-runtime", "Lockstep", in.build.cuda_runtime_version, in.gpus);
}

Check check_driver_vs_nccl(const DoctorInput& in) {
  if (in.build.nccl_version == 0) {
    return {"driver-vs-nccl", Status::kInfo, "this lockstep was built without NCCL (no nccl backend)", "", {}};
  }
  const std::string nccl = "NCCL " + gpu::nccl_version_string(in.build.nccl_version);
  std::vector<std::string> details;
  if (in.build.nccl_library_version != 0 && in.build.nccl_library_version != in.build.nccl_version) {
    details.push_back("built with nccl.h " + gpu::nccl_version_string(in.build.nccl_version) + ", running libnccl " +
                      gpu::nccl_version_string(in.build.nccl_library_version));
  }
  if (!in.gpus.loaded() || in.gpus.cuda_driver_version == 0) {
    return {
        "driver-vs-nccl", Status::kInfo,
        nccl + " for CUDA " + gpu::cuda_version_string(in.build.nccl_cuda_version) + "; no driver to compare it with",
        "", details};
  }
  Check c = compare_cuda("driver-vs-nccl", nccl, in.build.nccl_cuda_version, in.gpus);
  c.details = details;
  return c;
}

Check check_other_processes(const DoctorInput& in) {
  Check c{"other-processes", Status::kPass, "", "", {}};
  std::vector<std::string> held;
  size_t ours = 0;
  for (const auto& d : in.gpus.devices) {
    uint64_t others_bytes = 0;
    std::vector<std::string> owners;
    for (const gpu::GpuProcess& p : d.processes) {
      const std::string memory = p.used_bytes ? format_bytes(*p.used_bytes) : "memory unknown";
      if (p.in_this_namespace && p.uid == in.env.uid) {
        ++ours;
        c.details.push_back(gpu_label(d) + ": pid " + std::to_string(p.pid) + " (yours: " + p.command + "), " + memory);
        continue;
      }
      others_bytes += p.used_bytes.value_or(0);
      const std::string who =
          p.in_this_namespace ? p.user + ": " + p.command : "outside this container's PID namespace";
      owners.push_back(p.in_this_namespace ? p.user : "pid " + std::to_string(p.pid));
      c.details.push_back(gpu_label(d) + ": pid " + std::to_string(p.pid) + " (" + who + "), " + memory);
    }
    if (!owners.empty()) {
      std::sort(owners.begin(), owners.end());
      owners.erase(std::unique(owners.begin(), owners.end()), owners.end());
      held.push_back(gpu_label(d) + " (" + format_bytes(others_bytes) + " by " + join(owners, ", ") + ")");
    }
  }
  if (held.empty()) {
    c.summary = ours == 0 ? "no process holds GPU memory" : "only your own processes hold GPU memory";
    return c;
  }
  c.status = Status::kWarn;
  c.summary = "processes not yours (other users', or outside this PID namespace) hold " + join(held, ", ");
  c.fix = "use the other GPUs (lockstep run --gpus auto, or CUDA_VISIBLE_DEVICES), or ask the owners";
  return c;
}

Check check_gpu_leases(const DoctorInput& in) {
  Check c{"gpu-leases", Status::kPass, "", "", {}};
  std::vector<std::string> leased;
  for (const auto& d : in.gpus.devices) {
    const auto lease = in.leases.find(d.index);
    if (lease == in.leases.end()) continue;
    leased.push_back(gpu_label(d));
    c.details.push_back(gpu_label(d) + ": leased by " + lease->second);
  }
  if (leased.empty()) {
    c.summary = "no GPU is leased by a lockstep run job";
    return c;
  }
  // A lease is a job at work, not a fault: what `lockstep run --gpus auto` will leave alone.
  c.status = Status::kInfo;
  c.summary = "leased by lockstep run jobs: " + join(leased, ", ") + " (lockstep run --gpus auto takes the others)";
  return c;
}

Check check_ecc(const DoctorInput& in) {
  Check c{"ecc", Status::kPass, "", "", {}};
  std::vector<std::string> failing, disabled;
  for (const auto& d : in.gpus.devices) {
    if (d.ecc_enabled == false) disabled.push_back(std::to_string(d.index));
    const uint64_t uncorrected = d.ecc_uncorrected_volatile.value_or(0);
    const uint64_t corrected = d.ecc_corrected_volatile.value_or(0);
    if (uncorrected > 0) {
      failing.push_back(gpu_label(d));
      c.details.push_back(gpu_label(d) + ": " + std::to_string(uncorrected) +
                          " uncorrected ECC errors since the last reset");
    }
    if (corrected > 0) {
      c.details.push_back(gpu_label(d) + ": " + std::to_string(corrected) + " corrected ECC errors (harmless alone)");
    }
  }
  if (!disabled.empty()) c.details.push_back("ECC is off on GPU " + join(disabled, ", "));
  if (!failing.empty()) {
    c.status = Status::kFail;
    c.summary = "uncorrected ECC errors on " + join(failing, ", ") + ": results computed there may be wrong";
    c.fix = "drain the node and reset the GPU (nvidia-smi -r -i <index>); if errors return, replace it";
    return c;
  }
  c.summary = "no uncorrected ECC errors";
  return c;
}

Check check_retired_pages(const DoctorInput& in) {
  Check c{"retired-pages", Status::kPass, "", "", {}};
  std::vector<std::string> pending, retired, unread;
  for (const auto& d : in.gpus.devices) {
    // A100, H100 and later retire no pages (NVML: Not Supported): row-remapping covers them.
    if (!d.retired_pages && !d.remapped_rows_correctable) unread.push_back(gpu_label(d));
    if (d.retired_pages_pending == true) pending.push_back(gpu_label(d));
    if (d.retired_pages.value_or(0) > 0) {
      retired.push_back(gpu_label(d));
      c.details.push_back(gpu_label(d) + ": " + std::to_string(*d.retired_pages) + " retired memory pages" +
                          (d.retired_pages_pending == true ? ", a retirement pending" : ""));
    } else if (d.retired_pages_pending == true) {
      c.details.push_back(gpu_label(d) + ": a page retirement is pending");
    }
  }
  if (!pending.empty()) {
    c.status = Status::kFail;
    c.summary = "page retirement pending on " + join(pending, ", ") + ": the bad memory stays in use until a reset";
    c.fix = "drain the node and reset the GPU (nvidia-smi -r -i <index>) or reboot";
  } else if (!retired.empty()) {
    c.status = Status::kWarn;
    c.summary = "retired memory pages on " + join(retired, ", ") + " (already taken out of use)";
    c.fix = "watch the count (nvidia-smi -q -d PAGE_RETIREMENT); a growing one means the GPU is failing";
  } else if (!unread.empty()) {
    // Nothing read is not nothing wrong.
    c.status = Status::kInfo;
    c.summary = "unknown on " + join(unread, ", ") + ": NVML gave neither retired pages nor remapped rows";
  } else if (std::none_of(in.gpus.devices.begin(), in.gpus.devices.end(),
                          [](const auto& d) { return d.retired_pages.has_value(); })) {
    c.status = Status::kInfo;
    c.summary = "these GPUs remap rows instead of retiring pages (see row-remapping)";
  } else {
    c.summary = "no retired memory pages";
  }
  return c;
}

Check check_row_remapping(const DoctorInput& in) {
  Check c{"row-remapping", Status::kPass, "", "", {}};
  std::vector<std::string> failed, pending, uncorrectable, read;
  for (const auto& d : in.gpus.devices) {
    if (!d.remapped_rows_correctable) continue;
    read.push_back(gpu_label(d));
    if (d.remap_failed == true) failed.push_back(gpu_label(d));
    if (d.remap_pending == true) pending.push_back(gpu_label(d));
    if (d.remapped_rows_uncorrectable.value_or(0) > 0) uncorrectable.push_back(gpu_label(d));
    if (*d.remapped_rows_correctable > 0 || d.remapped_rows_uncorrectable.value_or(0) > 0) {
      c.details.push_back(gpu_label(d) + ": " + std::to_string(*d.remapped_rows_correctable) +
                          " rows remapped for correctable errors, " +
                          std::to_string(d.remapped_rows_uncorrectable.value_or(0)) + " for uncorrectable ones");
    }
  }
  if (read.empty()) {
    c.status = Status::kInfo;
    c.summary = "not reported by these GPUs (before Ampere they retire pages instead; see retired-pages)";
  } else if (!failed.empty()) {
    c.status = Status::kFail;
    c.summary = "a row remap failed on " + join(failed, ", ") + ": the GPU has no spare rows left";
    c.fix = "take the GPU out of service and have it replaced (nvidia-smi -q -d ROW_REMAPPER)";
  } else if (!pending.empty()) {
    c.status = Status::kFail;
    c.summary = "a row remap is pending on " + join(pending, ", ") + ": the bad rows stay in use until a reset";
    c.fix = "drain the node and reset the GPU (nvidia-smi -r -i <index>) or reboot";
  } else if (!uncorrectable.empty()) {
    c.status = Status::kWarn;
    c.summary = "rows remapped for uncorrectable errors on " + join(uncorrectable, ", ") + " (already replaced)";
    c.fix = "watch the count (nvidia-smi -q -d ROW_REMAPPER); a growing one means the GPU is failing";
  } else {
    c.summary = "no row remap pending or failed (" + std::to_string(read.size()) + " GPUs that remap rows)";
  }
  return c;
}

Check check_throttling(const DoctorInput& in) {
  Check c{"throttling", Status::kPass, "", "", {}};
  std::vector<std::string> thermal, power;
  for (const auto& d : in.gpus.devices) {
    if (!d.throttle_reasons) continue;
    const uint64_t reasons = *d.throttle_reasons;
    const bool hot = gpu::is_thermal_throttle(reasons), capped = gpu::is_power_throttle(reasons);
    if (hot) thermal.push_back(gpu_label(d));
    if (capped) power.push_back(gpu_label(d));
    if (hot || capped) {
      std::string line = gpu_label(d) + ": " + gpu::throttle_reason_names(reasons);
      if (d.temperature_c) line += ", " + std::to_string(*d.temperature_c) + " C";
      if (d.power_mw && d.power_limit_mw) {
        line += ", " + std::to_string(*d.power_mw / 1000) + " W of " + std::to_string(*d.power_limit_mw / 1000) + " W";
      }
      c.details.push_back(line);
    }
  }
  if (thermal.empty() && power.empty()) {
    c.summary = "no GPU is slowed by heat or power";
    return c;
  }
  c.status = Status::kWarn;
  std::vector<std::string> parts;
  if (!thermal.empty()) parts.push_back("thermal on " + join(thermal, ", "));
  if (!power.empty()) parts.push_back("power on " + join(power, ", "));
  c.summary = "clocks throttled: " + join(parts, "; ") + " (the slowest GPU sets a synchronous job's pace)";
  c.fix = thermal.empty() ? "check the power limit (nvidia-smi -q -d POWER) and the power supply"
                          : "check the cooling (fans, airflow, inlet temperature) of the throttled GPUs";
  return c;
}

Check check_persistence(const DoctorInput& in) {
  Check c{"persistence", Status::kPass, "", "", {}};
  std::vector<std::string> off;
  for (const auto& d : in.gpus.devices) {
    if (d.persistence_mode == false) off.push_back(std::to_string(d.index));
  }
  if (off.empty()) {
    c.summary = "persistence mode is on (or not reported) on every GPU";
    return c;
  }
  c.status = Status::kWarn;
  c.summary = "persistence mode is off on GPU " + join(off, ", ") +
              ": the driver tears each GPU down when the last process exits, so every start pays seconds of "
              "initialization";
  c.fix = "sudo nvidia-smi -pm 1 (or run nvidia-persistenced)";
  return c;
}

}  // namespace lockstep::tools
