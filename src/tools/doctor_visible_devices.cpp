// The CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER rule. CUDA reads the list left to right and
// silently stops at the first entry it cannot use, so "0,1,9" on an 8-GPU host gives two
// GPUs and no error; and it numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID,
// so cuda:0 need not be nvidia-smi's GPU 0 on a mixed host.
#include <algorithm>
#include <numeric>
#include <sstream>

#include "tools/doctor_checks.h"

namespace lockstep::tools {
namespace {

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t") - begin + 1);
}

// NVML indices in CUDA's order: PCI bus order, or fastest first (compute capability, then
// SM count; NVML order between equals).
std::vector<size_t> cuda_order(const gpu::GpuState& gpus, bool pci_bus_order) {
  std::vector<size_t> order(gpus.devices.size());
  std::iota(order.begin(), order.end(), 0);
  if (pci_bus_order) return order;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const gpu::GpuDevice &x = gpus.devices[a], &y = gpus.devices[b];
    if (x.compute_major != y.compute_major) return x.compute_major > y.compute_major;
    if (x.compute_minor != y.compute_minor) return x.compute_minor > y.compute_minor;
    return x.multiprocessors.value_or(0) > y.multiprocessors.value_or(0);
  });
  return order;
}

std::string nvml_list(const gpu::GpuState& gpus, const std::vector<size_t>& positions) {
  std::string text;
  for (size_t i = 0; i < positions.size(); ++i) {
    if (i > 0) text += ',';
    text += std::to_string(gpus.devices[positions[i]].index);
  }
  return text;
}

}  // namespace

Check check_visible_devices(const DoctorInput& in) {
  Check c{"visible-devices", Status::kPass, "", "", {}};
  const gpu::GpuState& gpus = in.gpus;
  const std::string order_name = in.env.cuda_device_order.value_or("");
  const bool pci_order = order_name == "PCI_BUS_ID";
  if (!order_name.empty() && order_name != "PCI_BUS_ID" && order_name != "FASTEST_FIRST") {
    c.details.push_back("CUDA_DEVICE_ORDER='" + order_name +
                        "' is neither PCI_BUS_ID nor FASTEST_FIRST: CUDA uses FASTEST_FIRST");
  }
  const std::vector<size_t> order = cuda_order(gpus, pci_order);
  std::vector<size_t> pci(order.size());
  std::iota(pci.begin(), pci.end(), 0);
  const bool order_differs = order != pci;

  std::vector<size_t> selected;
  std::string stop;  // why CUDA stops reading the list, empty when it reads it all
  std::vector<std::string> ignored;
  if (in.env.cuda_visible_devices) {
    std::istringstream list(*in.env.cuda_visible_devices);
    std::vector<std::string> entries;
    for (std::string entry; std::getline(list, entry, ',');) entries.push_back(trim(entry));
    for (size_t e = 0; e < entries.size() && stop.empty(); ++e) {
      const std::string& entry = entries[e];
      std::vector<size_t> matches;
      if (!entry.empty() && std::all_of(entry.begin(), entry.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
        const size_t k = entry.size() > 6 ? order.size() : std::stoul(entry);
        if (k < order.size()) {
          matches.push_back(order[k]);
        } else {
          stop = "'" + entry + "' is out of range (CUDA numbers " + std::to_string(order.size()) + " GPUs 0-" +
                 std::to_string(order.size() - 1) + ")";
        }
      } else if (entry.rfind("GPU-", 0) == 0) {
        // CUDA takes any unique prefix of a UUID.
        for (size_t i = 0; i < gpus.devices.size(); ++i) {
          if (gpus.devices[i].uuid.rfind(entry, 0) == 0) matches.push_back(i);
        }
        if (matches.empty()) stop = "'" + entry + "' matches no GPU's UUID";
        if (matches.size() > 1) stop = "'" + entry + "' is the start of " + std::to_string(matches.size()) + " UUIDs";
      } else if (entry.rfind("MIG-", 0) == 0) {
        c.details.push_back("'" + entry + "' names a MIG instance, which this check cannot verify");
        continue;
      } else {
        stop = "'" + entry + "' is neither an index nor a GPU UUID";
      }
      if (stop.empty() && std::find(selected.begin(), selected.end(), matches[0]) != selected.end()) {
        stop = "'" + entry + "' repeats a GPU already listed";
      }
      if (!stop.empty()) {
        ignored.assign(entries.begin() + static_cast<std::ptrdiff_t>(e), entries.end());
      } else {
        selected.push_back(matches[0]);
      }
    }
  } else {
    selected = order;
  }

  const std::string shown = in.env.cuda_visible_devices ? "CUDA_VISIBLE_DEVICES='" + *in.env.cuda_visible_devices + "'"
                                                        : "CUDA_VISIBLE_DEVICES is not set";
  for (size_t k = 0; k < selected.size(); ++k) {
    c.details.push_back("cuda:" + std::to_string(k) + " = NVML GPU " + std::to_string(gpus.devices[selected[k]].index) +
                        " (" + gpus.devices[selected[k]].name + ")");
  }
  if (!stop.empty()) {
    std::string dropped;
    for (size_t i = 0; i < ignored.size(); ++i) {
      if (i > 0) dropped += ',';
      dropped += ignored[i];
    }
    c.status = selected.empty() ? Status::kFail : Status::kWarn;
    c.summary = shown + ": CUDA stops at " + stop + ", so it ignores '" + dropped + "' and sees " +
                std::to_string(selected.size()) + " GPU" + (selected.size() == 1 ? "" : "s");
    c.fix = "list only GPUs that exist, each once: indices 0-" + std::to_string(order.size() - 1) +
            " or UUIDs from nvidia-smi -L";
    return c;
  }
  if (in.env.cuda_visible_devices && selected.empty()) {
    c.status = Status::kWarn;
    c.summary = shown + ": CUDA sees no GPU";
    c.fix = "unset CUDA_VISIBLE_DEVICES to use the GPUs, or leave it empty on purpose to run on CPU devices";
    return c;
  }
  if (order_differs && in.env.cuda_visible_devices &&
      std::any_of(in.env.cuda_visible_devices->begin(), in.env.cuda_visible_devices->end(),
                  [](char ch) { return ch >= '0' && ch <= '9'; }) &&
      in.env.cuda_visible_devices->find("GPU-") == std::string::npos) {
    c.status = Status::kWarn;
    c.summary = shown + " counts in CUDA's fastest-first order, so it selects NVML (nvidia-smi) GPUs " +
                nvml_list(gpus, selected) + ", not the GPUs with those numbers in nvidia-smi";
    c.fix = "export CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA and nvidia-smi number the GPUs alike";
    return c;
  }
  if (order_differs) {
    c.status = Status::kWarn;
    c.summary = shown + "; CUDA numbers the GPUs fastest first (cuda:0 is NVML GPU " +
                std::to_string(gpus.devices[order[0]].index) + "), unlike nvidia-smi's PCI bus order";
    c.fix = "export CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA and nvidia-smi number the GPUs alike";
    return c;
  }
  c.summary = shown + "; CUDA sees " + std::to_string(selected.size()) + " GPU" + (selected.size() == 1 ? "" : "s") +
              (selected.size() == gpus.devices.size() ? "" : " (NVML GPUs " + nvml_list(gpus, selected) + ")") +
              ", numbered as nvidia-smi numbers them";
  return c;
}

}  // namespace lockstep::tools
