#include "tools/top/top_lines.h"

#include <cstdio>
#include <ctime>

namespace lockstep::tools {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;

std::string format(const char* pattern, auto... values) {
  char text[512];
  std::snprintf(text, sizeof(text), pattern, values...);
  return text;
}

// A reading or "-" when NVML could not give it.
std::string or_dash(const std::optional<unsigned>& value, const char* unit) {
  return value ? std::to_string(*value) + unit : "-";
}

std::string watts(const std::optional<unsigned>& milliwatts) {
  return milliwatts ? std::to_string((*milliwatts + 500) / 1000) : "-";
}

}  // namespace

std::string local_time(std::chrono::system_clock::time_point when) {
  const std::time_t t = std::chrono::system_clock::to_time_t(when);
  std::tm parts{};
  localtime_r(&t, &parts);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S", &parts);
  return text;
}

std::string utc_timestamp(std::chrono::system_clock::time_point when) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(when.time_since_epoch()).count();
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm parts{};
  gmtime_r(&t, &parts);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &parts);
  return format("%s.%03dZ", text, static_cast<int>(ms % 1000));
}

std::string driver_line(const TopSample& sample) {
  const gpu::GpuState& gpus = sample.gpus;
  std::string line = "driver " + (gpus.driver_version.empty() ? "?" : gpus.driver_version);
  if (gpus.cuda_driver_version > 0)
    line += format("  CUDA %d.%d", gpus.cuda_driver_version / 1000, gpus.cuda_driver_version % 1000 / 10);
  return line + "  NVML " + gpus.library_path;
}

std::string cpu_view_reason(const TopSample& sample) {
  const gpu::GpuState& gpus = sample.gpus;
  if (gpus.loaded()) return "NVML (" + gpus.library_path + ") found no GPU; showing the CPU cores";
  std::string reason = gpus.load_error;
  // The file tried belongs in the line even when the loader's message leaves it out.
  if (!sample.nvml_library_tried.empty() && reason.find(sample.nvml_library_tried) == std::string::npos)
    reason = sample.nvml_library_tried + ": " + reason;
  return "no NVIDIA driver found (" + reason + "); showing the CPU cores";
}

std::string device_header() {
  return format("%3s %4s %-24s %4s %7s %19s %5s %13s %9s  %s", "GPU", "CUDA", "NAME", "UTIL", "MEMUTIL", "MEMORY",
                "TEMP", "POWER", "SM CLOCK", "THROTTLE");
}

std::string device_row(const gpu::GpuDevice& device, std::optional<unsigned> cuda_index) {
  // A total of 0 means the memory call failed (the device's `unavailable` says why).
  const std::string memory = device.memory_total == 0 ? "-"
                                                      : std::to_string(device.memory_used / kMiB) + " / " +
                                                            std::to_string(device.memory_total / kMiB) + " MiB";
  const std::string power = watts(device.power_mw) + " / " + watts(device.power_limit_mw) + " W";
  const std::string throttle = device.throttle_reasons ? gpu::throttle_reason_names(*device.throttle_reasons) : "-";
  return format("%3u %4s %-24.24s %4s %7s %19s %5s %13s %9s  %s", device.index,
                cuda_index ? std::to_string(*cuda_index).c_str() : "-", device.name.c_str(),
                or_dash(device.utilization_gpu, "%").c_str(), or_dash(device.utilization_memory, "%").c_str(),
                memory.c_str(), or_dash(device.temperature_c, "C").c_str(), power.c_str(),
                or_dash(device.sm_clock_mhz, " MHz").c_str(), throttle.c_str());
}

std::vector<std::string> lease_rows(const TopSample& sample, const gpu::GpuDevice& device) {
  const auto lease = sample.leases.find(device.index);
  if (lease == sample.leases.end()) return {};
  return {"         leased by " + lease->second};
}

std::vector<std::string> process_rows(const gpu::GpuDevice& device) {
  std::vector<std::string> rows;
  // Why columns are blank: the NVML calls that failed, with NVML's words.
  for (const std::string& failed : device.unavailable) rows.push_back("         unavailable: " + failed);
  for (const gpu::GpuProcess& process : device.processes) {
    const std::string memory = process.used_bytes ? std::to_string(*process.used_bytes / kMiB) + " MiB" : "? MiB";
    const std::string who =
        process.in_this_namespace
            ? (process.user.empty() ? std::to_string(process.uid) : process.user) + "  " + process.command
            : "(another PID namespace: user and command unknown here)";
    // NVML's per-process sample: the share of the GPU this process's kernels took.
    const std::string share = process.sm_utilization ? format("  SM %3u%%  mem %3u%%", *process.sm_utilization,
                                                              process.memory_utilization.value_or(0))
                                                     : "";
    rows.push_back(format("         pid %-8u %10s%s  %s", process.pid, memory.c_str(), share.c_str(), who.c_str()));
  }
  return rows;
}

std::string core_header() { return format("%-6s %6s", "CPU", "UTIL"); }

std::string core_row(size_t core, double percent) {
  return format("%-6s %5.1f%%", ("cpu" + std::to_string(core)).c_str(), percent);
}

std::string host_memory_row(const HostMemory& memory) {
  const double percent =
      memory.total > 0 ? 100.0 * static_cast<double>(memory.used()) / static_cast<double>(memory.total) : 0.0;
  return format("memory %llu / %llu MiB (%.1f%%)", static_cast<unsigned long long>(memory.used() / kMiB),
                static_cast<unsigned long long>(memory.total / kMiB), percent);
}

std::string alert_row(const Alert& alert) { return "ALERT " + alert.message; }

std::string plain_block(const TopSample& sample) {
  std::string text = "lockstep top  " + local_time(sample.taken) + "  ";
  if (sample.shows_gpus()) {
    text += driver_line(sample) + "\n";
    if (!sample.order_warning.empty()) text += "WARNING " + sample.order_warning + "\n";
    text += device_header() + "\n";
    for (size_t i = 0; i < sample.gpus.devices.size(); ++i) {
      text += device_row(sample.gpus.devices[i], sample.cuda_index_of(i)) + "\n";
      for (const std::string& row : lease_rows(sample, sample.gpus.devices[i])) text += row + "\n";
      for (const std::string& row : process_rows(sample.gpus.devices[i])) text += row + "\n";
    }
  } else {
    text += cpu_view_reason(sample) + "\n" + core_header() + "\n";
    for (size_t i = 0; i < sample.cpu.core_utilization.size(); ++i)
      text += core_row(i, sample.cpu.core_utilization[i]) + "\n";
    text += host_memory_row(sample.cpu.memory) + "\n";
  }
  for (const Alert& alert : sample.alerts) text += alert_row(alert) + "\n";
  return text;
}

}  // namespace lockstep::tools
