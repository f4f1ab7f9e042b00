// The topology rule: the GPU-to-GPU matrix as `nvidia-smi topo -m` prints it, and what it
// means for all-reduce, which runs at the speed of the slowest link its ring or tree uses.
#include <algorithm>

#include "tools/doctor/doctor_checks.h"

namespace lockstep::tools {
namespace {

std::string pad(const std::string& text, size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

// The rows of the matrix and nvidia-smi's legend.
std::vector<std::string> matrix(const gpu::GpuState& gpus) {
  const size_t n = gpus.devices.size();
  size_t width = 6;
  for (const auto& row : gpus.topology) {
    for (const gpu::GpuPath& path : row) width = std::max(width, gpu::to_string(path).size() + 2);
  }
  std::vector<std::string> lines;
  std::string header = pad("", width);
  for (size_t j = 0; j < n; ++j) header += pad("GPU" + std::to_string(gpus.devices[j].index), width);
  while (!header.empty() && header.back() == ' ') header.pop_back();
  lines.push_back(header);
  for (size_t i = 0; i < n; ++i) {
    std::string line = pad("GPU" + std::to_string(gpus.devices[i].index), width);
    for (size_t j = 0; j < n; ++j) line += pad(gpu::to_string(gpus.topology[i][j]), width);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    lines.push_back(line);
  }
  lines.insert(
      lines.end(),
      {"", "Legend:", "  X    = Self",
       "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
       "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a "
       "NUMA node",
       "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
       "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
       "  PIX  = Connection traversing at most a single PCIe bridge",
       "  NV#  = Connection traversing a bonded set of # NVLinks"});
  return lines;
}

}  // namespace

Check check_topology(const DoctorInput& in) {
  Check c{"topology", Status::kInfo, "", "", {}};
  const gpu::GpuState& gpus = in.gpus;
  const size_t n = gpus.devices.size();
  if (n < 2) {
    c.summary = "one GPU: no GPU-to-GPU traffic";
    return c;
  }
  if (gpus.topology.size() != n) {
    c.summary = "GPU-to-GPU paths were not read";
    return c;
  }
  c.details = matrix(gpus);
  size_t pairs = 0, nvlink_pairs = 0;
  gpu::GpuLink worst = gpu::GpuLink::kSelf;
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      const gpu::GpuLink link = gpus.topology[i][j].link;
      ++pairs;
      if (link == gpu::GpuLink::kNvlink) ++nvlink_pairs;
      worst = std::max(worst, link);
    }
  }
  const std::string worst_name = gpu::to_string(gpu::GpuPath{worst, 0});
  if (nvlink_pairs == pairs) {
    c.status = Status::kPass;
    c.summary = "every pair of the " + std::to_string(n) +
                " GPUs is joined by NVLink (direct or NVSwitch): all-reduce runs at NVLink speed";
  } else if (nvlink_pairs > 0) {
    // Some pairs have NVLink and some do not: which GPUs a job gets decides its speed.
    c.status = Status::kWarn;
    c.summary = std::to_string(pairs - nvlink_pairs) + " of " + std::to_string(pairs) +
                " GPU pairs have no NVLink (the slowest is " + worst_name +
                "): an all-reduce over all GPUs runs at the speed of its slowest link";
    c.fix = "put ranks that communicate on GPUs joined by NV# in the matrix (choose them with CUDA_VISIBLE_DEVICES)";
  } else {
    // Nothing to choose between: a fact about the machine, not something to act on.
    c.summary = "no NVLink: all-reduce is limited by PCIe" +
                std::string(worst >= gpu::GpuLink::kPhb
                                ? ", and pairs over " + worst_name + " also by the CPU's host bridge or interconnect"
                                : "");
  }
  return c;
}

}  // namespace lockstep::tools
