// Where each device's time and memory went over a run of data-parallel steps: totals per
// device, the end-of-run table that names the slowest device and the share of time spent
// communicating, the same as JSON, and the spans of a Chrome trace.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/obs/chrome_trace.h"
#include "lockstep/parallel/step.h"

namespace lockstep::tools {

// One device over a whole run.
struct DeviceTotals {
  parallel::DeviceTimes times;  // summed over the steps (`started` unused)
  int64_t peak_bytes = 0;       // the allocator's peak on that device
};

class DeviceReport {
 public:
  // names[d]: device d of this process as the user knows it ("cpu:1"). trace_path: "" for
  // no trace. Of a job of several processes, each rank writes its own part (rank r > 0 to
  // trace_path.rank<r>), its own process row, and rank 0 merges them at the end.
  DeviceReport(const std::vector<std::string>& names, const std::string& trace_path, int rank = 0, int ranks = 1);

  // One step's times; `number`, the step's number in the run, labels its trace spans.
  void add_step(const std::vector<parallel::DeviceTimes>& step, int64_t number = -1);
  // Per device of this process, its summed times (`started` unused).
  const std::vector<parallel::DeviceTimes>& totals() const { return totals_; }
  int64_t steps() const { return steps_; }
  // Every rank closes its part, then (after the job's barrier) rank 0 merges the others'.
  void close_trace();
  void merge_rank_traces();

  // The one step's times, for a metrics.jsonl line.
  static nlohmann::json step_json(const std::vector<parallel::DeviceTimes>& step);
  // Totals of every device of the job (this process's, or gathered from every rank):
  // per device in seconds, as shares of its time, and its peak memory, and a table for
  // people that ends with the slowest device and the communication share.
  static nlohmann::json json(const std::vector<std::string>& names, const std::vector<DeviceTotals>& totals);
  static std::string table(const std::vector<std::string>& names, const std::vector<DeviceTotals>& totals,
                           int64_t steps);

 private:
  std::vector<parallel::DeviceTimes> totals_;
  int64_t steps_ = 0;
  double origin_ = -1;  // the first step's start, the trace's time zero
  std::string trace_path_;
  int rank_ = 0, ranks_ = 1;
  std::unique_ptr<ChromeTrace> trace_;
};

}  // namespace lockstep::tools
