#include "tools/plan/machine_profile.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "lockstep/core/allocator.h"
#include "lockstep/core/cuda_device.h"
#include "lockstep/core/error.h"
#include "lockstep/core/parallel.h"
#include "lockstep/core/tensor.h"
#include "lockstep/ops/ops.h"

namespace lockstep::tools {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

// The fraction of the dense peak a GPT-2-sized training step reaches on these GPUs. llm.c
// trains GPT-2 124M on 8x A100 80 GB at about 1.85M tokens/s (10B tokens in 90 minutes),
// 6 x 124M x 1.85M / 8 = 172 TFLOP/s per GPU in bf16 before attention: about 55% of 312.
constexpr double kTrainingFraction = 0.5;
// A kernel launch, about 5 us from the host through the driver (CUDA's own figure for an
// empty kernel is 3-7 us).
constexpr double kKernelLaunchSeconds = 5e-6;

const std::vector<MachineProfile>& profiles() {
  static const std::vector<MachineProfile> all = {
      {.name = "a100-80g-8x",
       .description = "8x A100 80 GB SXM4, NVLink 3 through NVSwitch",
       .source = "NVIDIA A100 datasheet (19.5 TFLOP/s fp32, 312 bf16/f16 dense); nccl-tests all-reduce busbw "
                 "on DGX A100 about 230 GB/s; the training fraction from llm.c's GPT-2 124M run",
       .devices = 8,
       .memory_bytes = 80 * kGiB,
       .fp32_flops = 19.5e12,
       .bf16_flops = 312e12,
       .f16_flops = 312e12,
       .achieved_fraction = kTrainingFraction,
       .bus_bandwidth = 230e9,
       .collective_latency_seconds = 20e-6,
       .memory_bandwidth = 2.0e12,
       .kernel_launch_seconds = kKernelLaunchSeconds},
      {.name = "h100-sxm-8x",
       .description = "8x H100 80 GB SXM5, NVLink 4 through NVSwitch",
       .source = "NVIDIA H100 datasheet (67 TFLOP/s fp32, 989 bf16/f16 dense); nccl-tests all-reduce busbw on "
                 "DGX H100 about 450 GB/s",
       .devices = 8,
       .memory_bytes = 80 * kGiB,
       .fp32_flops = 67e12,
       .bf16_flops = 989e12,
       .f16_flops = 989e12,
       .achieved_fraction = kTrainingFraction,
       .bus_bandwidth = 450e9,
       .collective_latency_seconds = 20e-6,
       .memory_bandwidth = 3.35e12,
       .kernel_launch_seconds = kKernelLaunchSeconds},
      {.name = "h200-8x",
       .description = "8x H200 141 GB SXM, NVLink 4 through NVSwitch",
       .source = "NVIDIA H200 datasheet (H100's compute: 67 TFLOP/s fp32, 989 bf16/f16 dense; 141 GB HBM3e, "
                 "143771 MiB as nvidia-smi shows); busbw as H100's",
       .devices = 8,
       .memory_bytes = 143771 * kMiB,
       .fp32_flops = 67e12,
       .bf16_flops = 989e12,
       .f16_flops = 989e12,
       .achieved_fraction = kTrainingFraction,
       .bus_bandwidth = 450e9,
       .collective_latency_seconds = 20e-6,
       .memory_bandwidth = 4.8e12,
       .kernel_launch_seconds = kKernelLaunchSeconds},
      {.name = "t4-4x-pcie",
       .description = "4x T4 16 GB, PCIe 3 x16, no NVLink",
       .source = "NVIDIA T4 datasheet (8.1 TFLOP/s fp32, 65 f16, no bf16); all-reduce over PCIe 3 through the "
                 "host bridge about 6 GB/s busbw",
       .devices = 4,
       .memory_bytes = 15360 * kMiB,
       .fp32_flops = 8.1e12,
       .bf16_flops = 0,
       .f16_flops = 65e12,
       .achieved_fraction = kTrainingFraction,
       .bus_bandwidth = 6e9,
       .collective_latency_seconds = 30e-6,
       .memory_bandwidth = 0.32e12,
       .kernel_launch_seconds = kKernelLaunchSeconds},
      {.name = "rtx4090-2x-pcie",
       .description = "2x RTX 4090 24 GB, PCIe 4 x16, no peer access",
       .source = "NVIDIA Ada whitepaper (82.6 TFLOP/s fp32, 165.2 bf16/f16 with f32 accumulation, dense); "
                 "all-reduce through host memory about 10 GB/s busbw",
       .devices = 2,
       .memory_bytes = 24564 * kMiB,
       .fp32_flops = 82.6e12,
       .bf16_flops = 165.2e12,
       .f16_flops = 165.2e12,
       .achieved_fraction = kTrainingFraction,
       .bus_bandwidth = 10e9,
       .collective_latency_seconds = 30e-6,
       .memory_bandwidth = 1.0e12,
       .kernel_launch_seconds = kKernelLaunchSeconds},
  };
  return all;
}

std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// The profile of a GPU model as NVML names it ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB
// HBM3", "Tesla T4", "NVIDIA GeForce RTX 4090"), or null.
const MachineProfile* profile_of_gpu(const std::string& gpu_name) {
  const std::string name = lowercase(gpu_name);
  const auto with = [](const char* profile) {
    for (const MachineProfile& p : profiles()) {
      if (p.name == profile) return &p;
    }
    return static_cast<const MachineProfile*>(nullptr);
  };
  if (name.find("a100") != std::string::npos) return with("a100-80g-8x");
  if (name.find("h200") != std::string::npos) return with("h200-8x");
  if (name.find("h100") != std::string::npos) return with("h100-sxm-8x");
  if (name.find("t4") != std::string::npos) return with("t4-4x-pcie");
  if (name.find("4090") != std::string::npos) return with("rtx4090-2x-pcie");
  return nullptr;
}

template <typename Body>
double best_seconds(int repeats, Body&& body) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

double MachineProfile::flops(const std::string& precision) const {
  if (precision == "bf16") return bf16_flops * achieved_fraction;
  if (precision == "f16") return f16_flops * achieved_fraction;
  return fp32_flops * achieved_fraction;
}

std::vector<std::string> machine_profile_names() {
  std::vector<std::string> names = {"this-host"};
  for (const MachineProfile& p : profiles()) names.push_back(p.name);
  return names;
}

MachineProfile named_machine_profile(const std::string& name) {
  for (const MachineProfile& p : profiles()) {
    if (p.name == name) return p;
  }
  std::string choices;
  for (const std::string& n : machine_profile_names()) choices += (choices.empty() ? "" : ", ") + n;
  throw UsageError("--machine: unknown machine '" + name + "'; use one of " + choices +
                   ", or the path of a `lockstep doctor --json` report");
}

MachineProfile machine_profile_from_doctor(const nlohmann::json& report, const std::string& path) {
  const nlohmann::json* devices = nullptr;
  if (report.contains("facts") && report["facts"].contains("gpus") && report["facts"]["gpus"].contains("devices")) {
    devices = &report["facts"]["gpus"]["devices"];
  }
  if (devices == nullptr || !devices->is_array()) {
    throw UsageError("--machine " + path + ": not a `lockstep doctor --json` report (no facts.gpus.devices)");
  }
  if (devices->empty()) {
    throw UsageError("--machine " + path + ": the report lists no GPU; plan for a named machine instead (" +
                     named_machine_profile("a100-80g-8x").name + ", ...)");
  }
  const std::string gpu = (*devices)[0].value("name", "");
  const MachineProfile* model = profile_of_gpu(gpu);
  if (model == nullptr) {
    std::string known;
    for (const MachineProfile& p : profiles()) known += (known.empty() ? "" : ", ") + p.description;
    throw UsageError("--machine " + path + ": no rates are known for its GPU '" + gpu + "' (known: " + known + ")");
  }
  MachineProfile machine = *model;
  machine.name = path;
  machine.devices = static_cast<int>(devices->size());
  double smallest = 0;
  for (const nlohmann::json& d : *devices) {
    const double bytes = d.value("memory_total_bytes", 0.0);
    smallest = smallest == 0 ? bytes : std::min(smallest, bytes);
  }
  if (smallest > 0) machine.memory_bytes = smallest;
  machine.description = std::to_string(machine.devices) + "x " + gpu + " (from " + path + ")";
  machine.source = "GPU count and memory from the report; rates from the " + model->name + " profile: " + model->source;
  return machine;
}

MachineProfile this_host_profile(int devices) {
  const int cores = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  const double host_memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  MachineProfile machine;
  machine.name = "this-host";
  machine.cpu_devices = true;
  machine.devices = devices;
  // A CPU device has the host's memory, shared, unless LOCKSTEP_CPU_DEVICE_MEMORY gives it
  // a GPU's fixed share (core/allocator.h).
  const auto limit = static_cast<double>(cpu_device_memory_limit());
  machine.memory_bytes = limit > 0 ? std::min(limit, host_memory / devices) : host_memory / devices;
  machine.achieved_fraction = 1;

  // One device's GEMM rate on its share of the cores; devices beyond the cores share them.
  const int threads = std::max(1, cores / devices);
  const double share = std::min(1.0, static_cast<double>(cores) / (static_cast<double>(devices) * threads));
  const int previous = num_threads();
  set_num_threads(threads);
  constexpr int64_t n = 512;
  const Tensor a = Tensor::ones({n, n}, DType::f32, Device::cpu(0)),
               b = Tensor::ones({n, n}, DType::f32, Device::cpu(0));
  const double gemm = best_seconds(3, [&] { (void)matmul(a, b); });
  set_num_threads(previous);
  machine.fp32_flops = 2.0 * n * n * n / gemm * share;

  // The shared-memory collectives copy through one segment: a rank's bandwidth is about
  // that of a copy, shared by the devices copying at once.
  std::vector<char> from(64 << 20, 1), to(from.size());
  const double copy = best_seconds(3, [&] { std::memcpy(to.data(), from.data(), from.size()); });
  machine.bus_bandwidth = static_cast<double>(from.size()) / copy * std::min(1.0, static_cast<double>(cores) / devices);
  machine.collective_latency_seconds = 20e-6;
  machine.memory_bandwidth = 2 * machine.bus_bandwidth;  // a copy reads and writes each byte
  machine.core_share = share;
  machine.threads_per_device = threads;
  machine.description = std::to_string(devices) + " CPU device" + (devices == 1 ? "" : "s") + " on this host's " +
                        std::to_string(cores) + " core" + (cores == 1 ? "" : "s");
  machine.source = "measured now: a 512x512 f32 GEMM on " + std::to_string(threads) + " thread" +
                   (threads == 1 ? "" : "s") + ", a 64 MiB copy, /proc's physical memory";
  return machine;
}

MachineProfile this_host_gpu_profile(const gpu::GpuState& state, int devices) {
  LOCKSTEP_CHECK(!state.devices.empty()) << "NVML lists no GPU on this host"
                                         << (state.load_error.empty() ? "" : " (" + state.load_error + ")");
  // The report doctor --json would write of these GPUs, read as one from another server.
  nlohmann::json listed = nlohmann::json::array();
  for (const gpu::GpuDevice& d : state.devices) {
    listed.push_back({{"name", d.name}, {"memory_total_bytes", d.memory_total}});
  }
  MachineProfile machine =
      machine_profile_from_doctor({{"facts", {{"gpus", {{"devices", listed}}}}}}, "this host's NVML");
  machine.name = "this-host";
  machine.devices = devices;
  const auto cap = static_cast<double>(cuda::device_memory_limit());
  const bool capped = cap > 0 && cap < machine.memory_bytes;
  if (capped) machine.memory_bytes = cap;
  machine.description = std::to_string(devices) + "x " + state.devices.front().name + " on this host" +
                        (capped ? " (LOCKSTEP_CUDA_DEVICE_MEMORY caps each)" : "");
  return machine;
}

}  // namespace lockstep::tools
