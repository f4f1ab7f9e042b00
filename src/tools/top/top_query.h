// nvidia-smi's query interface for `lockstep top`, so scripts written for it run unchanged:
//   lockstep top --query-gpu=index,name,utilization.gpu,memory.used --format=csv[,noheader][,nounits]
// and `-i 0,2` / `--id` to choose the GPUs (by NVML index, UUID or PCI bus id, as
// nvidia-smi -i takes them). The fields are nvidia-smi's names (with its aliases), the
// header and the units as it prints them, "[N/A]" for a reading the GPU does not give.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "lockstep/gpu/gpu_state.h"
#include "tools/top/top_sample.h"

namespace lockstep::tools {

struct QueryField {
  std::string name;  // the canonical name the header shows: "clocks.current.sm"
  std::string unit;  // "MiB", "%", "W", "MHz", or "" (printed in the header as " [unit]")
};

struct QueryFormat {
  bool header = true;
  bool units = true;
};

// "a, b ,c" -> {"a", "b", "c"}: the comma-separated lists of --query-* and --format.
std::vector<std::string> query_list(const std::string& text);
// A sample's time as nvidia-smi's timestamp field prints it: "2024/05/01 12:00:00.123".
std::string query_timestamp(std::chrono::system_clock::time_point when);

// The fields `text` lists, looked up in any case in `known` (its names and aliases); the
// UsageError unknown(name) for a name it lacks, and `none` for an empty list.
std::vector<QueryField> lookup_query_fields(const std::string& text, const std::map<std::string, QueryField>& known,
                                            const std::function<std::string(const std::string&)>& unknown,
                                            const std::string& none);

// "index,name,memory.used" -> the fields; UsageError naming a field nvidia-smi would not take.
std::vector<QueryField> parse_query_fields(const std::string& text);
// "csv", "csv,noheader", "csv,nounits", "csv,noheader,nounits"; UsageError otherwise.
QueryFormat parse_query_format(const std::string& text);

// "index, name, memory.used [MiB]"
std::string query_header(const std::vector<QueryField>& fields, const QueryFormat& format);
// One line per GPU of the sample, in its order: "0, NVIDIA RTX A6000, 40212 MiB".
std::string query_rows(const TopSample& sample, const std::vector<QueryField>& fields, const QueryFormat& format);

// The GPUs `ids` names ("0,2", UUIDs, PCI bus ids, or a mix), in the order NVML lists them;
// UsageError naming an id that matches no GPU (with the ones there are).
std::vector<unsigned> select_gpus(const gpu::GpuState& gpus, const std::string& ids);
// The sample with only those GPUs, each with its CUDA number (read before, over them all).
void keep_gpus(TopSample& sample, const std::vector<unsigned>& indices);

}  // namespace lockstep::tools
