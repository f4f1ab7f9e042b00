#include "tools/top/top_log.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "lockstep/core/error.h"
#include "tools/top/top_json.h"
#include "tools/top/top_lines.h"

namespace lockstep::tools {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

template <typename T>
std::string or_empty(const std::optional<T>& value) {
  return value ? std::to_string(*value) : "";
}

std::string watts(const std::optional<unsigned>& milliwatts) {
  if (!milliwatts) return "";
  char text[32];
  std::snprintf(text, sizeof(text), "%.3f", *milliwatts / 1000.0);
  return text;
}

std::string alert_kinds(const TopSample& sample, std::optional<unsigned> device) {
  std::string kinds;
  for (const Alert& alert : sample.alerts) {
    const bool names_device =
        !device || std::find(alert.devices.begin(), alert.devices.end(), *device) != alert.devices.end();
    if (names_device && kinds.find(alert.kind) == std::string::npos) {
      if (!kinds.empty()) kinds += ' ';
      kinds += alert.kind;
    }
  }
  return kinds;
}

std::string join_row(const std::vector<std::string>& fields) {
  std::string row;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) row += ',';
    row += csv_field(fields[i]);
  }
  return row;
}

}  // namespace

LogFormat log_format_for(const std::string& path) {
  if (ends_with(path, ".csv")) return LogFormat::kCsv;
  if (ends_with(path, ".jsonl")) return LogFormat::kJsonl;
  throw UsageError("--log " + path + ": the file name must end in .csv or .jsonl (it picks the format)");
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

std::string csv_header() {
  return "time,device,nvml_index,cuda_index,name,uuid,utilization_percent,memory_utilization_percent,"
         "memory_used_mib,memory_total_mib,temperature_c,power_w,power_limit_w,sm_clock_mhz,throttle_reasons,"
         "processes,alerts";
}

std::vector<std::string> csv_rows(const TopSample& sample) {
  const std::string time = utc_timestamp(sample.taken);
  std::vector<std::string> rows;
  if (sample.shows_gpus()) {
    for (size_t i = 0; i < sample.gpus.devices.size(); ++i) {
      const gpu::GpuDevice& d = sample.gpus.devices[i];
      // "pid:user:MiB" per process; "pid:?:MiB" for one from another PID namespace.
      std::string processes;
      for (const gpu::GpuProcess& p : d.processes) {
        if (!processes.empty()) processes += ' ';
        processes += std::to_string(p.pid) + ":" + (p.in_this_namespace ? p.user : "?") + ":" +
                     (p.used_bytes ? std::to_string(*p.used_bytes / kMiB) : "?");
      }
      rows.push_back(join_row(
          {time, "gpu" + std::to_string(d.index), std::to_string(d.index), or_empty(sample.cuda_index_of(i)), d.name,
           d.uuid, or_empty(d.utilization_gpu), or_empty(d.utilization_memory), std::to_string(d.memory_used / kMiB),
           std::to_string(d.memory_total / kMiB), or_empty(d.temperature_c), watts(d.power_mw), watts(d.power_limit_mw),
           or_empty(d.sm_clock_mhz), d.throttle_reasons ? gpu::throttle_reason_names(*d.throttle_reasons) : "",
           processes, alert_kinds(sample, d.index)}));
    }
    return rows;
  }
  const std::vector<double>& cores = sample.cpu.core_utilization;
  const auto percent = [](double value) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.1f", value);
    return std::string(text);
  };
  const double mean = cores.empty() ? 0.0 : std::accumulate(cores.begin(), cores.end(), 0.0) / cores.size();
  rows.push_back(join_row(
      {time, "cpu", "", "", "", "", percent(mean), "", std::to_string(sample.cpu.memory.used() / kMiB),
       std::to_string(sample.cpu.memory.total / kMiB), "", "", "", "", "", "", alert_kinds(sample, std::nullopt)}));
  for (size_t i = 0; i < cores.size(); ++i)
    rows.push_back(join_row(
        {time, "cpu" + std::to_string(i), "", "", "", "", percent(cores[i]), "", "", "", "", "", "", "", "", "", ""}));
  return rows;
}

TopLog::TopLog(const std::string& path, LogFormat format) : path_(path), format_(format) {
  file_ = std::fopen(path.c_str(), "a");
  LOCKSTEP_CHECK(file_ != nullptr) << "cannot open the log " << path << " for appending: " << std::strerror(errno)
                                   << " (check the folder exists and is writable)";
  // Appending to a CSV that has rows already: its header is there.
  std::fseek(file_, 0, SEEK_END);
  if (format_ == LogFormat::kCsv && std::ftell(file_) == 0) std::fprintf(file_, "%s\n", csv_header().c_str());
  std::fflush(file_);
}

TopLog::~TopLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void TopLog::write(const TopSample& sample) {
  if (format_ == LogFormat::kCsv) {
    for (const std::string& row : csv_rows(sample)) std::fprintf(file_, "%s\n", row.c_str());
  } else {
    std::fprintf(file_, "%s\n", sample_json(sample).dump().c_str());
  }
  LOCKSTEP_CHECK(std::fflush(file_) == 0) << "cannot write the log " << path_ << ": " << std::strerror(errno);
}

}  // namespace lockstep::tools
