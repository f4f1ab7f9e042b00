#include "tools/run/run_gpus.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>

#include "lockstep/core/error.h"
#include "lockstep/gpu/device_order.h"
#include "lockstep/gpu/gpu_selection.h"
#include "lockstep/gpu/nvml.h"
#include "tools/common/byte_size.h"

namespace lockstep::tools {
namespace {

using Clock = std::chrono::steady_clock;

GpuAssignment assignment(const gpu::GpuState& state, const std::vector<unsigned>& chosen) {
  GpuAssignment a;
  a.indices = chosen;
  for (unsigned index : chosen) {
    const gpu::GpuDevice& d = state.devices[index];
    // UUIDs name the same GPU whatever CUDA_DEVICE_ORDER says; the list's order is the
    // workers' CUDA order, so LOCAL_RANK r finds its GPU as cuda:r.
    a.cuda_visible_devices +=
        (a.cuda_visible_devices.empty() ? "" : ",") + (d.uuid.empty() ? std::to_string(d.index) : d.uuid);
    a.per_rank.push_back("GPU " + std::to_string(d.index) + " (" + d.name + ", " + format_bytes(d.memory_free) +
                         " free)");
  }
  return a;
}

}  // namespace

GpuAssignment assign_gpus(const GpuAsk& ask, const volatile bool& interrupted) {
  const gpu::Nvml nvml;
  gpu::GpuState state = nvml.read({.processes = true, .topology = false});
  if (!state.loaded() || state.devices.empty()) {
    const std::string why = state.loaded() ? "NVML lists no GPU" : state.load_error;
    if (ask.gpus.empty()) return {};
    if (ask.gpus != "auto") throw UsageError("--gpus " + ask.gpus + ": no NVIDIA GPU on this host (" + why + ")");
    GpuAssignment cpu;
    cpu.notice = "no NVIDIA GPU on this host (" + why +
                 "): the workers get CPU devices cpu:0..cpu:" + std::to_string(ask.workers - 1);
    return cpu;
  }
  if (ask.gpus.empty() &&
      (ask.workers > static_cast<int>(state.devices.size()) || std::getenv("CUDA_VISIBLE_DEVICES"))) {
    // torchrun's behaviour: more workers than GPUs (CPU jobs), or GPUs the user chose.
    return {};
  }

  gpu::GpuRequest request;
  request.count = ask.workers;
  request.min_free_bytes = ask.min_free_bytes;
  request.uid = static_cast<uint32_t>(getuid());
  if (!ask.gpus.empty() && ask.gpus != "auto") request.indices = gpu::parse_gpu_list(ask.gpus);
  // GPUs the launcher itself was given (a scheduler's CUDA_VISIBLE_DEVICES) bound the choice.
  if (std::getenv("CUDA_VISIBLE_DEVICES") != nullptr)
    request.allowed = gpu::cuda_devices_from_environment(state).visible;

  const auto leases = std::make_shared<gpu::GpuLeases>();
  const auto uuids_of = [&](const std::vector<unsigned>& indices) {
    std::vector<std::string> uuids;
    for (unsigned index : indices) uuids.push_back(state.devices[index].uuid);
    return uuids;
  };
  const Clock::time_point start = Clock::now();
  std::string last_reason;
  for (;;) {
    // GPUs other jobs lease are busy, whatever NVML shows (a job may not have touched its
    // GPU yet).
    request.leased = leases->held_elsewhere(state);
    const gpu::GpuSelection selection = gpu::select_gpus(state, request);
    if (!selection.chosen.empty()) {
      // A launch started at the same moment may have leased one of them since: then choose again.
      if (!leases->take_all(uuids_of(selection.chosen), ask.holder)) continue;
      GpuAssignment assigned = assignment(state, selection.chosen);
      assigned.leases = leases;
      return assigned;
    }
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (ask.wait_seconds >= 0 && waited >= ask.wait_seconds) {
      LOCKSTEP_FAIL() << "the GPUs asked for are not free"
                      << (waited >= 1 ? " after " + std::to_string(std::lround(waited)) + " s" : std::string()) << ": "
                      << selection.waiting_for
                      << " (wait longer with --wait SECONDS, lower --min-free-memory, or name GPUs with --gpus)";
    }
    if (selection.waiting_for != last_reason) {
      std::fprintf(stderr, "lockstep run: waiting for GPUs: %s\n", selection.waiting_for.c_str());
      last_reason = selection.waiting_for;
    }
    for (auto until = Clock::now() + std::chrono::duration<double>(ask.poll_seconds); Clock::now() < until;) {
      LOCKSTEP_CHECK(!interrupted) << "stopped while waiting for GPUs";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    state = nvml.read({.processes = true, .topology = false});
  }
}

GpuUtilization::GpuUtilization(std::vector<unsigned> indices) : indices_(std::move(indices)) {
  if (!indices_.empty()) nvml_ = std::make_unique<gpu::Nvml>();
}

void GpuUtilization::sample() {
  if (!nvml_ || !nvml_->loaded()) return;
  gpu::GpuState state;
  try {
    state = nvml_->read({.processes = false, .topology = false});
  } catch (const Error&) {
    return;  // a reading that failed is left out: the figure is the mean of those that worked
  }
  for (unsigned index : indices_) {
    for (const gpu::GpuDevice& d : state.devices) {
      if (d.index != index || !d.utilization_gpu) continue;
      sum_ += *d.utilization_gpu;
      ++count_;
    }
  }
}

std::optional<double> GpuUtilization::mean() const {
  return count_ > 0 ? std::optional<double>(sum_ / static_cast<double>(count_)) : std::nullopt;
}

}  // namespace lockstep::tools
