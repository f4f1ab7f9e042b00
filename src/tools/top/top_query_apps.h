// nvidia-smi's other query, for the compute processes on the GPUs:
//   lockstep top --query-compute-apps=pid,process_name,used_memory --format=csv[,noheader][,nounits]
// one line per process per GPU (nvidia-smi --help-query-compute-apps's fields and aliases),
// a header alone when none runs. A process of another PID namespace (another container)
// shows NVML's pid and "[Not Found]" for its name, as nvidia-smi shows it.
#pragma once

#include <string>
#include <vector>

#include "tools/top/top_query.h"
#include "tools/top/top_sample.h"

namespace lockstep::tools {

// "pid,name,used_memory" -> the fields (canonical names: pid, process_name,
// used_gpu_memory [MiB], gpu_name, gpu_bus_id, gpu_uuid, timestamp); UsageError naming a
// field nvidia-smi would not take.
std::vector<QueryField> parse_compute_app_fields(const std::string& text);

// One line per compute process of each GPU of the sample, GPUs in the sample's order.
std::string compute_app_rows(const TopSample& sample, const std::vector<QueryField>& fields, const QueryFormat& format);

}  // namespace lockstep::tools
