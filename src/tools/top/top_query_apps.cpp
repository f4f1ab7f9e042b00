#include "tools/top/top_query_apps.h"

#include <map>

namespace lockstep::tools {
namespace {

// nvidia-smi --help-query-compute-apps's names and aliases -> canonical field.
const std::map<std::string, QueryField>& known_fields() {
  static const std::map<std::string, QueryField> table = {
      {"timestamp", {"timestamp", ""}},
      {"gpu_name", {"gpu_name", ""}},
      {"gpu_bus_id", {"gpu_bus_id", ""}},
      {"gpu_uuid", {"gpu_uuid", ""}},
      {"pid", {"pid", ""}},
      {"process_name", {"process_name", ""}},
      {"name", {"process_name", ""}},
      {"used_gpu_memory", {"used_gpu_memory", "MiB"}},
      {"used_memory", {"used_gpu_memory", "MiB"}},
  };
  return table;
}

// NVML's name of a process is its executable as /proc/<pid>/cmdline's first word gives it.
std::string process_name(const gpu::GpuProcess& p) {
  if (!p.in_this_namespace || p.command.empty()) return "[Not Found]";
  return p.command.substr(0, p.command.find(' '));
}

std::string value_of(const TopSample& sample, const gpu::GpuDevice& d, const gpu::GpuProcess& p,
                     const std::string& field, bool units) {
  if (field == "timestamp") return query_timestamp(sample.taken);
  if (field == "gpu_name") return d.name;
  if (field == "gpu_bus_id") return d.pci_bus_id;
  if (field == "gpu_uuid") return d.uuid;
  if (field == "pid") return std::to_string(p.pid);
  if (field == "process_name") return process_name(p);
  if (!p.used_bytes) return "[N/A]";
  return std::to_string(*p.used_bytes / (1024 * 1024)) + (units ? " MiB" : "");
}

}  // namespace

std::vector<QueryField> parse_compute_app_fields(const std::string& text) {
  return lookup_query_fields(
      text, known_fields(),
      [](const std::string& name) {
        return "--query-compute-apps: field \"" + name +
               "\" is not a valid field to query; fields: timestamp, gpu_name, gpu_bus_id, gpu_uuid, pid, "
               "process_name (name), used_gpu_memory (used_memory)";
      },
      "--query-compute-apps needs fields, like --query-compute-apps=pid,process_name,used_memory");
}

std::string compute_app_rows(const TopSample& sample, const std::vector<QueryField>& fields,
                             const QueryFormat& format) {
  std::string out;
  for (const gpu::GpuDevice& d : sample.gpus.devices) {
    for (const gpu::GpuProcess& p : d.processes) {
      for (size_t i = 0; i < fields.size(); ++i) {
        if (i) out += ", ";
        out += value_of(sample, d, p, fields[i].name, format.units);
      }
      out += "\n";
    }
  }
  return out;
}

}  // namespace lockstep::tools
