// The rules about how the GPUs are connected, as the servers' failures show them: a PCIe
// link narrower or slower than its slot allows, NVLink errors, and on NVSwitch systems the
// fabric manager, without which CUDA does not start.
#include "tools/doctor/doctor_checks.h"

namespace lockstep::tools {
namespace {

std::string link_text(unsigned width, unsigned generation) {
  std::string text = "x";
  text += std::to_string(width) + " Gen" + std::to_string(generation);
  return text;
}

std::string link_lanes(unsigned width) {
  std::string text = "x";
  return text += std::to_string(width);
}

// One GPU's link as nvidia-smi -q shows it, and what is wrong with it ("" when nothing).
std::string pcie_problem(const gpu::GpuDevice& d) {
  std::string problem;
  if (d.pcie_width && d.pcie_width_max && *d.pcie_width < *d.pcie_width_max)
    problem = link_lanes(*d.pcie_width) + " of " + link_lanes(*d.pcie_width_max) + " lanes";
  if (d.pcie_generation_max && d.pcie_generation_gpu_max && *d.pcie_generation_max < *d.pcie_generation_gpu_max) {
    if (!problem.empty()) problem += ", and ";
    problem += "capped at Gen" + std::to_string(*d.pcie_generation_max) + " by its slot, of the GPU's Gen" +
               std::to_string(*d.pcie_generation_gpu_max);
  }
  return problem;
}

std::string count_text(uint64_t count, const std::string& one, const std::string& many) {
  return std::to_string(count) + " " + (count == 1 ? one : many);
}

}  // namespace

Check check_pcie_link(const DoctorInput& in) {
  Check c{"pcie-link", Status::kPass, "", "", {}};
  std::vector<std::string> degraded;
  size_t read = 0;
  for (const auto& d : in.gpus.devices) {
    if (!d.pcie_width || !d.pcie_width_max || !d.pcie_generation_max) continue;
    ++read;
    std::string line = gpu_label(d) + ": " + link_text(*d.pcie_width, *d.pcie_generation_max) + " at most";
    // An idle GPU lowers its link's speed to save power: the generation now is no finding.
    if (d.pcie_generation && *d.pcie_generation < *d.pcie_generation_max)
      line += std::string(" (Gen") + std::to_string(*d.pcie_generation) + " now: an idle GPU slows its link)";
    const std::string problem = pcie_problem(d);
    if (!problem.empty()) {
      line += ": " + problem;
      degraded.push_back(gpu_label(d) + " (" + problem + ")");
    }
    c.details.push_back(line);
  }
  if (read == 0) {
    c.status = Status::kInfo;
    c.summary = "unknown: NVML gave no PCIe link width or generation for any GPU";
    return c;
  }
  if (degraded.empty()) {
    c.summary = "every GPU's PCIe link is as wide and as fast as the GPU allows";
    if (read < in.gpus.devices.size()) c.summary += " (" + std::to_string(read) + " of the GPUs could be read)";
    return c;
  }
  c.status = Status::kWarn;
  c.summary = "PCIe links below what the GPU allows: " + join(degraded, ", ") +
              "; copies between host and GPU, and between GPUs without NVLink, run at that fraction";
  c.fix =
      "reseat the GPU (or its riser) in an x16 slot; in the BIOS set the slot's lanes to x16 (no bifurcation) and its "
      "speed to Auto; `lspci -vv` shows LnkCap against LnkSta";
  return c;
}

Check check_nvlink_errors(const DoctorInput& in) {
  Check c{"nvlink-errors", Status::kPass, "", "", {}};
  std::vector<std::string> erring;
  unsigned links = 0;
  size_t gpus = 0;
  for (const auto& d : in.gpus.devices) {
    if (!d.nvlink_errors) continue;
    const gpu::NvlinkErrors& e = *d.nvlink_errors;
    links += e.links;
    ++gpus;
    if (e.total() == 0) continue;
    std::vector<std::string> counts;
    if (e.replay) counts.push_back(count_text(e.replay, "replay", "replays"));
    if (e.recovery) counts.push_back(count_text(e.recovery, "recovery", "recoveries"));
    if (e.crc_flit) counts.push_back(count_text(e.crc_flit, "CRC flit error", "CRC flit errors"));
    if (e.crc_data) counts.push_back(count_text(e.crc_data, "CRC data error", "CRC data errors"));
    c.details.push_back(gpu_label(d) + ": " + join(counts, ", ") + " on its " + std::to_string(e.links) +
                        " links since the driver loaded");
    erring.push_back(gpu_label(d));
  }
  if (gpus == 0) {
    c.status = Status::kInfo;
    c.summary = "no active NVLink on any GPU (the GPUs talk over PCIe)";
    return c;
  }
  if (erring.empty()) {
    c.summary = "no NVLink errors on " + std::to_string(links) + " active links of " + std::to_string(gpus) + " GPUs";
    return c;
  }
  c.status = Status::kWarn;
  c.summary = "NVLink errors on " + join(erring, ", ") +
              ": each is corrected by resending (recoveries stall the link while it retrains), so collectives slow "
              "down before anything fails";
  c.fix =
      "`nvidia-smi nvlink -e -i <gpu>` shows which link; reset the counters (`nvidia-smi nvlink -r 0 -i <gpu>`) and "
      "watch: counts that keep growing mean a bad link or baseboard to service";
  return c;
}

Check check_fabric_manager(const DoctorInput& in) {
  Check c{"fabric-manager", Status::kPass, "", "", {}};
  bool nvswitch = false, registration_known = false;
  std::vector<std::string> unregistered;
  for (const auto& d : in.gpus.devices) {
    nvswitch |= d.behind_nvswitch || d.fabric_state.has_value();
    if (!d.fabric_state) continue;
    registration_known = true;
    switch (*d.fabric_state) {
      case gpu::FabricState::kNotStarted:
        unregistered.push_back(gpu_label(d) + " (not started)");
        break;
      case gpu::FabricState::kInProgress:
        unregistered.push_back(gpu_label(d) + " (in progress)");
        break;
      case gpu::FabricState::kCompleted:
        if (!d.fabric_error.empty()) unregistered.push_back(gpu_label(d) + " (failed: " + d.fabric_error + ")");
        break;
    }
  }
  if (!nvswitch) {
    c.status = Status::kInfo;
    c.summary = "no NVSwitch: this system needs no fabric manager";
    return c;
  }
  const std::string fix = "systemctl enable --now nvidia-fabricmanager, of the driver's version (" +
                          in.gpus.driver_version + "); `journalctl -u nvidia-fabricmanager` says why it stopped";
  if (registration_known) {
    if (unregistered.empty()) {
      c.summary = "every GPU is registered with the NVSwitch fabric";
      return c;
    }
    c.status = Status::kFail;
    c.summary = "the fabric manager has not registered " + join(unregistered, ", ") +
                " with the NVSwitch fabric: CUDA fails there with error 802 (system not yet initialized)";
    c.fix = fix;
    return c;
  }
  // GPUs before Hopper report no registration: whether the daemon runs is what can be seen.
  if (in.host.fabric_manager_running) {
    c.summary = "NVSwitch system, and nv-fabricmanager is running";
    return c;
  }
  c.status = Status::kWarn;
  c.summary =
      "NVSwitch system, but no nv-fabricmanager process is running here: without it CUDA fails with error 802 "
      "(system not yet initialized); in a container the host's processes are not visible, so check on the host";
  c.fix = fix;
  return c;
}

}  // namespace lockstep::tools
