// The rules of `lockstep doctor --deep`, over what the probes measured
// (doctor_deep_probes.cpp): the GPU-to-GPU copy matrix (wrong bytes, hangs, a pair far
// slower than the others of its link kind) and the per-GPU GEMM burn (wrong results, a GPU
// slower than the others of its model). Pure functions of plain results.
#include <algorithm>
#include <cstdio>
#include <map>

#include "tools/doctor/doctor_checks.h"

namespace lockstep::tools {
namespace {

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", decimals, value);
  return text;
}

// "245.3" for GB/s and TFLOP/s: one decimal, none from 1000 up.
std::string rate(double value) { return fixed(value, value >= 1000 ? 0 : 1); }

std::string seconds_text(double seconds) {
  return (seconds == static_cast<int64_t>(seconds) ? std::to_string(static_cast<int64_t>(seconds))
                                                   : fixed(seconds, 1)) +
         " s";
}

std::string device_text(int device) { return std::string("cuda:") + std::to_string(device); }

std::string pair_text(const PeerCopyResult& r) {
  std::string text = device_text(r.src) + " → " + device_text(r.dst);
  if (r.src_gpu && r.dst_gpu)
    text += std::string(" (GPU ") + std::to_string(*r.src_gpu) + " → GPU " + std::to_string(*r.dst_gpu) + ")";
  return text;
}

std::string gpu_text(const GemmBurnResult& r) {
  std::string text = device_text(r.device);
  if (r.gpu) text += std::string(" (GPU ") + std::to_string(*r.gpu) + ")";
  return text;
}

std::string mib_text(uint64_t bytes) {
  return bytes % (uint64_t{1} << 20) == 0 ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes) + " bytes";
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// The copies' GB/s as a matrix, rows copying to columns, as `nvidia-smi topo -m` lays out GPUs.
std::vector<std::string> copy_matrix(const DeepProbes& deep) {
  std::vector<int> devices;
  for (const PeerCopyResult& r : deep.copies) {
    for (int d : {r.src, r.dst})
      if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
  }
  std::sort(devices.begin(), devices.end());
  std::map<std::pair<int, int>, std::string> cells;
  for (const PeerCopyResult& r : deep.copies) {
    std::string cell = "-";
    if (r.outcome == ProbeOutcome::kHung) {
      cell = "HANG";
    } else if (r.outcome == ProbeOutcome::kFinished) {
      cell = !r.error.empty() ? "ERROR" : r.mismatches ? "WRONG" : rate(r.gbps);
    }
    cells[{r.src, r.dst}] = cell;
  }
  size_t width = 4;
  for (int d : devices) width = std::max(width, device_text(d).size());
  for (const auto& [pair, cell] : cells) width = std::max(width, cell.size());
  auto pad = [&](const std::string& text) { return text + std::string(width + 2 - text.size(), ' '); };
  std::vector<std::string> lines = {"GB/s from each row's device to each column's:"};
  std::string header = pad("");
  for (int d : devices) header += pad(device_text(d));
  lines.push_back(header.substr(0, header.find_last_not_of(' ') + 1));
  for (int from : devices) {
    std::string line = pad(device_text(from));
    for (int to : devices) {
      const auto it = cells.find({from, to});
      line += pad(from == to ? "X" : it != cells.end() ? it->second : "-");
    }
    lines.push_back(line.substr(0, line.find_last_not_of(' ') + 1));
  }
  return lines;
}

const char* kPeerFix =
    "GPU peer-to-peer is broken on this path (see the iommu-acs check): add iommu=pt (or intel_iommu=off / "
    "amd_iommu=off) to the kernel command line and reboot; on bare metal disable ACS on the PCIe bridges above the "
    "GPUs (sudo setpci -s <bdf> ECAP_ACS+0x6.w=0000 after each boot, or ACS off in the BIOS); until then "
    "NCCL_P2P_DISABLE=1 keeps jobs correct at a cost";

// What stops a deep check from judging anything: no CUDA device, or probes that never ran.
std::optional<Check> not_measured(const std::string& name, const DeepProbes& deep, bool measured) {
  Check c{name, Status::kInfo, "", "", {}};
  if (measured) return std::nullopt;
  if (!deep.error.empty()) {
    c.status = Status::kFail;
    c.summary = std::string("the probes could not run: ") + deep.error;
    c.fix = "dmesg for Xid errors; reset the GPUs (nvidia-smi -r) or reboot";
    return c;
  }
  if (deep.gpus == 0) {
    c.summary = "skipped: no CUDA device";
    if (!deep.no_device_reason.empty()) c.summary += " (" + deep.no_device_reason + ")";
    return c;
  }
  c.summary = std::string("not run: ") + (deep.stopped.empty() ? std::string("no probe result") : deep.stopped);
  return c;
}

}  // namespace

void name_probed_gpus(DeepProbes& deep, const gpu::GpuState& gpus, const std::vector<unsigned>& cuda_to_nvml) {
  if (deep.gpus == 0 || cuda_to_nvml.size() != static_cast<size_t>(deep.gpus)) return;
  const int per_gpu = std::max(deep.devices_per_gpu, 1);
  auto nvml = [&](int device) -> std::optional<unsigned> {
    const size_t physical = static_cast<size_t>(device / per_gpu);
    if (physical >= cuda_to_nvml.size() || cuda_to_nvml[physical] >= gpus.devices.size()) return std::nullopt;
    return cuda_to_nvml[physical];
  };
  for (PeerCopyResult& r : deep.copies) {
    r.src_gpu = nvml(r.src);
    r.dst_gpu = nvml(r.dst);
    if (r.src_gpu && r.dst_gpu && *r.src_gpu < gpus.topology.size() && *r.dst_gpu < gpus.topology[*r.src_gpu].size()) {
      r.link = gpu::to_string(gpus.topology[*r.src_gpu][*r.dst_gpu]);
    }
  }
  for (GemmBurnResult& r : deep.burns) {
    r.gpu = nvml(r.device);
    if (r.gpu) r.name = gpus.devices[*r.gpu].name;
  }
}

Check check_peer_copies(const DoctorInput& in) {
  const DeepProbes& deep = *in.deep;
  if (deep.gpus == 1) return Check{"peer-copies", Status::kInfo, "one GPU: no pairs to copy between", "", {}};
  if (auto skipped = not_measured("peer-copies", deep, !deep.copies.empty())) return *skipped;
  Check c{"peer-copies", Status::kPass, "", "", copy_matrix(deep)};

  std::vector<std::string> failures;
  for (const PeerCopyResult& r : deep.copies) {
    if (r.outcome == ProbeOutcome::kHung) {
      failures.push_back(std::string("the copy ") + pair_text(r) + " did not finish within " +
                         seconds_text(deep.timeout_seconds) + ": it hangs (NCCL hangs the same way there)");
    } else if (r.outcome == ProbeOutcome::kFinished && !r.error.empty()) {
      failures.push_back(pair_text(r) + " failed: " + r.error);
    } else if (r.outcome == ProbeOutcome::kFinished && r.mismatches > 0) {
      failures.push_back(pair_text(r) + " delivered wrong bytes: " + std::to_string(r.mismatches) + " of " +
                         std::to_string(r.bytes) + " differ, the first at offset " + std::to_string(r.first_mismatch) +
                         (r.zeros ? " (the destination holds zeros)" : ""));
    }
  }
  if (!deep.stopped.empty()) c.details.push_back(std::string("not run: ") + deep.stopped);
  if (!failures.empty()) {
    c.status = Status::kFail;
    c.summary = join(failures, "; ");
    c.fix = kPeerFix;
    return c;
  }
  if (std::none_of(deep.copies.begin(), deep.copies.end(), [](const PeerCopyResult& r) { return r.ok(); })) {
    c.status = Status::kInfo;
    c.summary = "not run: " + (deep.stopped.empty() ? std::string("no copy finished") : deep.stopped);
    return c;
  }

  // Pairs far slower than the median of their link kind ("" groups the pairs of unknown links).
  std::map<std::string, std::vector<double>> by_link;
  for (const PeerCopyResult& r : deep.copies)
    if (r.ok()) by_link[r.link].push_back(r.gbps);
  std::map<std::string, double> medians;
  for (const auto& [link, rates] : by_link) medians[link] = median(rates);
  std::vector<std::string> slow;
  size_t ok = 0;
  double lowest = 0, highest = 0;
  for (const PeerCopyResult& r : deep.copies) {
    if (!r.ok()) continue;
    lowest = ok == 0 ? r.gbps : std::min(lowest, r.gbps);
    highest = ok == 0 ? r.gbps : std::max(highest, r.gbps);
    ++ok;
    const double typical = medians[r.link];
    if (r.gbps < kSlowPairFraction * typical) {
      slow.push_back(pair_text(r) + " at " + rate(r.gbps) + " GB/s, below half the " + rate(typical) +
                     " GB/s median of the " + (r.link.empty() ? std::string("other") : r.link) + " pairs");
    }
  }
  if (!slow.empty()) {
    c.status = Status::kWarn;
    c.summary = std::string("copies between GPUs far slower than on the other pairs: ") + join(slow, "; ") +
                ": collectives run at the slowest pair's pace";
    c.fix =
        "look for a link trained down (the pcie-link check, lspci -vv), NVLinks down (nvidia-smi nvlink -s -i "
        "<gpu>) or ACS routing peer traffic through the root complex (the iommu-acs check); another job copying "
        "between these GPUs slows them too";
    return c;
  }
  const uint64_t bytes = deep.copies.front().bytes;
  c.summary = std::to_string(ok) + " ordered pairs of " + std::to_string(deep.gpus) + " GPUs copied " +
              mib_text(bytes) + " each, byte for byte intact, at " +
              (lowest == highest ? rate(lowest) : rate(lowest) + "-" + rate(highest)) + " GB/s";
  if (!deep.stopped.empty()) {
    c.status = Status::kInfo;
    c.summary += "; the other pairs were not run";
  }
  return c;
}

Check check_gemm_burn(const DoctorInput& in) {
  const DeepProbes& deep = *in.deep;
  if (auto skipped = not_measured("gemm-burn", deep, !deep.burns.empty())) return *skipped;
  Check c{"gemm-burn", Status::kPass, "", "", {}};

  std::vector<std::string> failures;
  for (const GemmBurnResult& r : deep.burns) {
    std::string line = gpu_text(r) + (r.name.empty() ? "" : " " + r.name) + ": ";
    if (r.outcome == ProbeOutcome::kHung) {
      failures.push_back(std::string("the products on ") + gpu_text(r) + " did not finish within " +
                         seconds_text(deep.timeout_seconds + r.seconds) + ": the GPU hangs");
      line += "hung";
    } else if (r.outcome == ProbeOutcome::kNotRun) {
      line += "not run";
    } else if (!r.error.empty()) {
      failures.push_back(std::string("the products on ") + gpu_text(r) + " failed: " + r.error);
      line += std::string("failed: ") + r.error;
    } else {
      line += rate(r.tflops) + " TFLOP/s " + r.dtype + ", " + std::to_string(r.iterations) + " products of " +
              std::to_string(r.n) + " x " + std::to_string(r.n) + " in " + fixed(r.seconds, 2) + " s";
      if (r.wrong > 0) {
        failures.push_back(gpu_text(r) + " computes wrong products: " + std::to_string(r.wrong) + " of " +
                           std::to_string(r.checked) + " elements checked differ from the CPU's, first " +
                           r.first_wrong);
        line += std::string("; ") + std::to_string(r.wrong) + " of " + std::to_string(r.checked) + " elements wrong";
      } else {
        line += std::string("; ") + std::to_string(r.checked) + " elements match the CPU's";
      }
    }
    c.details.push_back(line);
  }
  if (!deep.stopped.empty()) c.details.push_back(std::string("not run: ") + deep.stopped);
  if (!failures.empty()) {
    c.status = Status::kFail;
    c.summary = join(failures, "; ");
    c.fix =
        "drain the node: dmesg for Xid errors, nvidia-smi -q -d ECC,ROW_REMAPPER for memory errors, reset the GPU "
        "(nvidia-smi -r -i <index>); if it recurs, replace the GPU";
    return c;
  }

  // Each GPU against the fastest of its model ("" groups GPUs of unknown model).
  std::map<std::string, double> fastest;
  for (const GemmBurnResult& r : deep.burns)
    if (r.ok()) fastest[r.name] = std::max(fastest[r.name], r.tflops);
  std::vector<std::string> slow;
  std::vector<std::string> figures;
  for (const GemmBurnResult& r : deep.burns) {
    if (!r.ok()) continue;
    figures.push_back(gpu_text(r) + " " + rate(r.tflops));
    if (r.tflops < kSlowGemmFraction * fastest[r.name]) slow.push_back(gpu_text(r) + " at " + rate(r.tflops));
  }
  if (figures.empty()) {
    c.status = Status::kInfo;
    c.summary = "not run: " + (deep.stopped.empty() ? std::string("no GPU finished") : deep.stopped);
    return c;
  }
  const std::string all = join(figures, ", ") + " TFLOP/s";
  if (!slow.empty()) {
    c.status = Status::kWarn;
    c.summary = "GPUs slower than the fastest of their model by more than " +
                std::to_string(static_cast<int>(100 - 100 * kSlowGemmFraction + 0.5)) + "%: " + join(slow, ", ") +
                " TFLOP/s (all: " + all +
                "); a synchronous job runs at the slowest GPU's pace. Products stay on one GPU, so PCIe and NVLink "
                "are not the cause";
    c.fix =
        "look for capped clocks or power (nvidia-smi -q -d PERFORMANCE,POWER,CLOCK: a lowered power limit, "
        "clocks locked low), thermal throttling (the throttling check; cooling) or another process on the GPU; "
        "watch it under load with lockstep top";
    return c;
  }
  const GemmBurnResult& first = deep.burns.front();
  c.summary = std::to_string(figures.size()) + " GPU" + (figures.size() == 1 ? "" : "s") + " multiplied " +
              std::to_string(first.n) + " x " + std::to_string(first.n) + " " + first.dtype + " matrices at " + all +
              "; the results match a CPU reference";
  if (!deep.stopped.empty()) {
    c.status = Status::kInfo;
    c.summary += "; the other GPUs were not run";
  }
  return c;
}

}  // namespace lockstep::tools
