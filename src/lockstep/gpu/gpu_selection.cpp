#include "lockstep/gpu/gpu_selection.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>

#include "lockstep/core/error.h"

namespace lockstep::gpu {
namespace {

std::string gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

std::string index_list(const std::vector<unsigned>& indices) {
  std::string text;
  for (unsigned i : indices) text += (text.empty() ? "" : ",") + std::to_string(i);
  return text;
}

// Why `device` cannot be used now ("" when it can).
std::string why_busy(const GpuDevice& device, const GpuRequest& request, bool auto_pick) {
  std::ostringstream why;
  if (const auto lease = request.leased.find(device.index); lease != request.leased.end()) {
    why << "GPU " << device.index << " is leased by " << lease->second;
  } else if (device.memory_free < request.min_free_bytes) {
    why << "GPU " << device.index << " has " << gib(device.memory_free) << " free, under the "
        << gib(request.min_free_bytes) << " asked";
  } else if (auto_pick && held_by_others(device, request.uid)) {
    why << "GPU " << device.index << " is held by ";
    bool first = true;
    for (const GpuProcess& p : device.processes) {
      if (p.in_this_namespace && p.uid == request.uid) continue;
      why << (first ? "" : ", ") << "pid " << p.pid << " ("
          << (p.in_this_namespace ? "user " + p.user : std::string("outside this PID namespace"));
      if (p.used_bytes) why << ", " << gib(*p.used_bytes);
      why << ")";
      first = false;
    }
  }
  return why.str();
}

}  // namespace

uint64_t foreign_bytes(const GpuDevice& device, uint32_t uid) {
  uint64_t bytes = 0;
  for (const GpuProcess& p : device.processes) {
    if (!p.in_this_namespace || p.uid != uid) bytes += p.used_bytes.value_or(0);
  }
  return bytes;
}

bool held_by_others(const GpuDevice& device, uint32_t uid) {
  return std::any_of(device.processes.begin(), device.processes.end(),
                     [&](const GpuProcess& p) { return !p.in_this_namespace || p.uid != uid; });
}

std::vector<unsigned> parse_gpu_list(const std::string& text) {
  std::vector<unsigned> indices;
  std::stringstream entries(text);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    const bool digits = !entry.empty() && entry.size() <= 4 &&
                        std::all_of(entry.begin(), entry.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits) {
      throw UsageError("--gpus takes 'auto' or NVML indices as nvidia-smi shows them, like 0,2,3; got '" + entry +
                       "' in '" + text + "'");
    }
    indices.push_back(static_cast<unsigned>(std::stoul(entry)));
  }
  if (indices.empty() || text.back() == ',') throw UsageError("--gpus list '" + text + "' is empty or ends in ','");
  return indices;
}

GpuSelection select_gpus(const GpuState& state, const GpuRequest& request) {
  std::vector<unsigned> allowed;
  for (const GpuDevice& d : state.devices) {
    if (!request.allowed || std::count(request.allowed->begin(), request.allowed->end(), d.index) > 0) {
      allowed.push_back(d.index);
    }
  }
  const std::string where = request.allowed ? " visible through CUDA_VISIBLE_DEVICES" : " on this host";
  const auto device = [&](unsigned index) -> const GpuDevice& {
    return *std::find_if(state.devices.begin(), state.devices.end(),
                         [&](const GpuDevice& d) { return d.index == index; });
  };

  GpuSelection selection;
  if (request.indices) {
    const std::vector<unsigned>& wanted = *request.indices;
    if (static_cast<int>(wanted.size()) != request.count) {
      throw UsageError("--gpus names " + std::to_string(wanted.size()) + " GPUs for -n " +
                       std::to_string(request.count) + ": give one GPU per worker");
    }
    if (std::set<unsigned>(wanted.begin(), wanted.end()).size() != wanted.size()) {
      throw UsageError("--gpus " + index_list(wanted) + " names a GPU twice");
    }
    for (unsigned index : wanted) {
      if (std::count(allowed.begin(), allowed.end(), index) == 0) {
        throw UsageError("there is no GPU " + std::to_string(index) + where + " (the GPUs are " +
                         (allowed.empty() ? std::string("none") : index_list(allowed)) + "; see lockstep top --once)");
      }
    }
    std::vector<std::string> busy;
    for (unsigned index : wanted) {
      const std::string why = why_busy(device(index), request, false);
      if (!why.empty()) busy.push_back(why);
    }
    if (busy.empty()) {
      selection.chosen = wanted;
    } else {
      for (const std::string& why : busy) selection.waiting_for += (selection.waiting_for.empty() ? "" : "; ") + why;
    }
    return selection;
  }

  if (request.count > static_cast<int>(allowed.size())) {
    throw UsageError("-n " + std::to_string(request.count) + " needs " + std::to_string(request.count) +
                     " GPUs and there are " + std::to_string(allowed.size()) + where);
  }
  std::vector<unsigned> ready;
  std::vector<std::string> busy;
  for (unsigned index : allowed) {
    const std::string why = why_busy(device(index), request, true);
    if (why.empty()) {
      ready.push_back(index);
    } else {
      busy.push_back(why);
    }
  }
  if (static_cast<int>(ready.size()) < request.count) {
    selection.waiting_for = std::to_string(ready.size()) + " of " + std::to_string(request.count) + " GPUs are free";
    for (const std::string& why : busy) selection.waiting_for += "; " + why;
    return selection;
  }
  // Most free memory first, then least busy, then bus order.
  std::stable_sort(ready.begin(), ready.end(), [&](unsigned a, unsigned b) {
    const GpuDevice &da = device(a), &db = device(b);
    if (da.memory_free != db.memory_free) return da.memory_free > db.memory_free;
    return da.utilization_gpu.value_or(0) < db.utilization_gpu.value_or(0);
  });
  ready.resize(static_cast<size_t>(request.count));
  std::sort(ready.begin(), ready.end());
  selection.chosen = ready;
  return selection;
}

}  // namespace lockstep::gpu
