#include "tools/top/top_query.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <functional>
#include <map>
#include <sstream>

#include "lockstep/core/error.h"
#include "lockstep/gpu/pci_bus_id.h"

namespace lockstep::tools {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;

// nvidia-smi's names (nvidia-smi --help-query-gpu) and their aliases -> canonical field.
const std::map<std::string, QueryField>& known_fields() {
  static const std::map<std::string, QueryField> table = {
      {"timestamp", {"timestamp", ""}},
      {"driver_version", {"driver_version", ""}},
      {"count", {"count", ""}},
      {"name", {"name", ""}},
      {"gpu_name", {"name", ""}},
      {"index", {"index", ""}},
      {"uuid", {"uuid", ""}},
      {"gpu_uuid", {"uuid", ""}},
      {"pci.bus_id", {"pci.bus_id", ""}},
      {"gpu_bus_id", {"pci.bus_id", ""}},
      {"persistence_mode", {"persistence_mode", ""}},
      {"compute_cap", {"compute_cap", ""}},
      {"utilization.gpu", {"utilization.gpu", "%"}},
      {"utilization.memory", {"utilization.memory", "%"}},
      {"memory.total", {"memory.total", "MiB"}},
      {"memory.reserved", {"memory.reserved", "MiB"}},
      {"memory.used", {"memory.used", "MiB"}},
      {"memory.free", {"memory.free", "MiB"}},
      {"temperature.gpu", {"temperature.gpu", ""}},
      {"power.draw", {"power.draw", "W"}},
      {"power.limit", {"power.limit", "W"}},
      {"clocks.sm", {"clocks.current.sm", "MHz"}},
      {"clocks.current.sm", {"clocks.current.sm", "MHz"}},
      {"clocks.max.sm", {"clocks.max.sm", "MHz"}},
      {"clocks.max.sm_clock", {"clocks.max.sm", "MHz"}},
      {"clocks.mem", {"clocks.current.memory", "MHz"}},
      {"clocks.current.memory", {"clocks.current.memory", "MHz"}},
      {"pcie.link.gen.current", {"pcie.link.gen.current", ""}},
      {"pcie.link.gen.gpucurrent", {"pcie.link.gen.current", ""}},
      {"pcie.link.gen.max", {"pcie.link.gen.max", ""}},
      {"pcie.link.gen.gpumax", {"pcie.link.gen.gpumax", ""}},
      {"pcie.link.width.current", {"pcie.link.width.current", ""}},
      {"pcie.link.width.max", {"pcie.link.width.max", ""}},
      {"clocks_throttle_reasons.active", {"clocks_throttle_reasons.active", ""}},
      {"clocks_event_reasons.active", {"clocks_event_reasons.active", ""}},
      {"ecc.errors.corrected.volatile.total", {"ecc.errors.corrected.volatile.total", ""}},
      {"ecc.errors.uncorrected.volatile.total", {"ecc.errors.uncorrected.volatile.total", ""}},
  };
  return table;
}

std::string trimmed(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t"), end = text.find_last_not_of(" \t");
  return begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
}

const std::string kNotAvailable = "[N/A]";

template <typename T>
std::string number(const std::optional<T>& value, const std::string& unit, bool units) {
  if (!value) return kNotAvailable;
  return std::to_string(*value) + (units && !unit.empty() ? " " + unit : "");
}

std::string watts(const std::optional<unsigned>& milliwatts, bool units) {
  if (!milliwatts) return kNotAvailable;
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", *milliwatts / 1000.0);
  return std::string(text) + (units ? " W" : "");
}

std::string mib(const gpu::GpuDevice& d, uint64_t bytes, bool units) {
  if (d.memory_total == 0) return kNotAvailable;  // the memory call failed
  return std::to_string(bytes / kMiB) + (units ? " MiB" : "");
}

std::string value_of(const TopSample& sample, const gpu::GpuDevice& d, const std::string& field, bool units) {
  if (field == "timestamp") return query_timestamp(sample.taken);
  if (field == "driver_version") return sample.gpus.driver_version;
  if (field == "count") return std::to_string(sample.gpus.devices.size());
  if (field == "name") return d.name;
  if (field == "index") return std::to_string(d.index);
  if (field == "uuid") return d.uuid;
  if (field == "pci.bus_id") return d.pci_bus_id;
  if (field == "persistence_mode") {
    return d.persistence_mode ? (*d.persistence_mode ? "Enabled" : "Disabled") : kNotAvailable;
  }
  if (field == "compute_cap") return std::to_string(d.compute_major) + "." + std::to_string(d.compute_minor);
  if (field == "utilization.gpu") return number(d.utilization_gpu, "%", units);
  if (field == "utilization.memory") return number(d.utilization_memory, "%", units);
  if (field == "memory.total") return mib(d, d.memory_total, units);
  if (field == "memory.reserved") return mib(d, d.memory_reserved, units);
  if (field == "memory.used") return mib(d, d.memory_used, units);
  if (field == "memory.free") return mib(d, d.memory_free, units);
  if (field == "temperature.gpu") return number(d.temperature_c, "", units);
  if (field == "power.draw") return watts(d.power_mw, units);
  if (field == "power.limit") return watts(d.power_limit_mw, units);
  if (field == "clocks.current.sm") return number(d.sm_clock_mhz, "MHz", units);
  if (field == "clocks.max.sm") return number(d.sm_clock_max_mhz, "MHz", units);
  if (field == "clocks.current.memory") return number(d.memory_clock_mhz, "MHz", units);
  if (field == "pcie.link.gen.current") return number(d.pcie_generation, "", units);
  if (field == "pcie.link.gen.max") return number(d.pcie_generation_max, "", units);
  if (field == "pcie.link.gen.gpumax") return number(d.pcie_generation_gpu_max, "", units);
  if (field == "pcie.link.width.current") return number(d.pcie_width, "", units);
  if (field == "pcie.link.width.max") return number(d.pcie_width_max, "", units);
  if (field == "clocks_throttle_reasons.active" || field == "clocks_event_reasons.active") {
    if (!d.throttle_reasons) return kNotAvailable;
    char text[32];
    std::snprintf(text, sizeof(text), "0x%016llx", static_cast<unsigned long long>(*d.throttle_reasons));
    return text;
  }
  if (field == "ecc.errors.corrected.volatile.total") return number(d.ecc_corrected_volatile, "", units);
  if (field == "ecc.errors.uncorrected.volatile.total") return number(d.ecc_uncorrected_volatile, "", units);
  return kNotAvailable;
}

}  // namespace

std::vector<std::string> query_list(const std::string& text) {
  std::vector<std::string> parts;
  std::istringstream in(text);
  for (std::string part; std::getline(in, part, ',');) parts.push_back(trimmed(part));
  return parts;
}

std::string query_timestamp(std::chrono::system_clock::time_point when) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(when);
  std::tm local{};
  localtime_r(&seconds, &local);
  char text[64];
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(when.time_since_epoch()).count() % 1000;
  std::snprintf(text, sizeof(text), "%04d/%02d/%02d %02d:%02d:%02d.%03lld", local.tm_year + 1900, local.tm_mon + 1,
                local.tm_mday, local.tm_hour, local.tm_min, local.tm_sec, static_cast<long long>(ms));
  return text;
}

std::vector<QueryField> lookup_query_fields(const std::string& text, const std::map<std::string, QueryField>& known,
                                            const std::function<std::string(const std::string&)>& unknown,
                                            const std::string& none) {
  std::vector<QueryField> fields;
  for (const std::string& name : query_list(text)) {
    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const auto it = known.find(lower);
    if (it == known.end()) throw UsageError(unknown(name));
    fields.push_back(it->second);
  }
  if (fields.empty()) throw UsageError(none);
  return fields;
}

std::vector<QueryField> parse_query_fields(const std::string& text) {
  return lookup_query_fields(
      text, known_fields(),
      [](const std::string& name) {
        return "--query-gpu: field \"" + name +
               "\" is not a valid field to query (or one lockstep top does not read); fields: index, name, uuid, "
               "pci.bus_id, utilization.gpu, utilization.memory, memory.total, memory.used, memory.free, "
               "temperature.gpu, power.draw, power.limit, clocks.sm, clocks.max.sm, ...";
      },
      "--query-gpu needs fields, like --query-gpu=index,name,memory.used");
}

QueryFormat parse_query_format(const std::string& text) {
  const std::vector<std::string> parts = query_list(text);
  if (parts.empty() || parts[0] != "csv") {
    throw UsageError("--format '" + text + "': the format is csv, with noheader and nounits if wanted (csv,noheader)");
  }
  QueryFormat format;
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i] == "noheader") {
      format.header = false;
    } else if (parts[i] == "nounits") {
      format.units = false;
    } else {
      throw UsageError("--format '" + text + "': '" + parts[i] + "' is not noheader or nounits");
    }
  }
  return format;
}

std::string query_header(const std::vector<QueryField>& fields, const QueryFormat& format) {
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i) line += ", ";
    line += fields[i].name;
    if (format.units && !fields[i].unit.empty()) line += " [" + fields[i].unit + "]";
  }
  return line + "\n";
}

std::string query_rows(const TopSample& sample, const std::vector<QueryField>& fields, const QueryFormat& format) {
  std::string out;
  for (const gpu::GpuDevice& d : sample.gpus.devices) {
    for (size_t i = 0; i < fields.size(); ++i) {
      if (i) out += ", ";
      out += value_of(sample, d, fields[i].name, format.units);
    }
    out += "\n";
  }
  return out;
}

std::vector<unsigned> select_gpus(const gpu::GpuState& gpus, const std::string& ids) {
  std::vector<unsigned> chosen;
  for (const std::string& id : query_list(ids)) {
    const auto match = std::find_if(gpus.devices.begin(), gpus.devices.end(), [&](const gpu::GpuDevice& d) {
      return std::to_string(d.index) == id || d.uuid == id ||
             (!d.pci_bus_id.empty() && gpu::normalize_pci_bus_id(d.pci_bus_id) == gpu::normalize_pci_bus_id(id));
    });
    if (id.empty() || match == gpus.devices.end()) {
      std::string there;
      for (const gpu::GpuDevice& d : gpus.devices) {
        if (!there.empty()) there += ",";
        there += std::to_string(d.index);
      }
      throw UsageError("--id " + ids + ": no GPU is '" + id + "' (the GPUs are " +
                       (there.empty() ? std::string("none") : there) + "; an NVML index, UUID or PCI bus id)");
    }
    if (std::find(chosen.begin(), chosen.end(), match->index) == chosen.end()) chosen.push_back(match->index);
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

void keep_gpus(TopSample& sample, const std::vector<unsigned>& indices) {
  std::vector<gpu::GpuDevice> devices;
  std::vector<std::optional<unsigned>> cuda;
  for (size_t i = 0; i < sample.gpus.devices.size(); ++i) {
    if (std::find(indices.begin(), indices.end(), sample.gpus.devices[i].index) == indices.end()) continue;
    devices.push_back(sample.gpus.devices[i]);
    cuda.push_back(sample.cuda_index_of(i));
  }
  sample.gpus.devices = std::move(devices);
  if (!sample.cuda_index.empty()) sample.cuda_index = std::move(cuda);
}

}  // namespace lockstep::tools
