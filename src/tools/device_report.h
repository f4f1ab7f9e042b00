// Where each device's time went over a run of data-parallel steps: totals per device, the
// end-of-run table that names the slowest device and the share of time spent
// communicating, the same as JSON, and the spans of a Chrome trace.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/obs/chrome_trace.h"
#include "lockstep/parallel/data_parallel.h"

namespace lockstep::tools {

class DeviceReport {
 public:
  // names[d]: device d as the user knows it ("cpu:1"). trace_path: "" for no trace.
  DeviceReport(std::vector<std::string> names, const std::string& trace_path);

  void add_step(const std::vector<parallel::DeviceTimes>& step);

  // Per device totals in seconds and shares of its step time.
  nlohmann::json json() const;
  // The one step's times, for a metrics.jsonl line.
  static nlohmann::json step_json(const std::vector<parallel::DeviceTimes>& step);
  // A table for people, ending with the slowest device and the communication share.
  std::string table() const;

 private:
  std::vector<std::string> names_;
  std::vector<parallel::DeviceTimes> totals_;  // `started` unused
  int64_t steps_ = 0;
  double origin_ = -1;  // the first step's start, the trace's time zero
  std::unique_ptr<ChromeTrace> trace_;
};

}  // namespace lockstep::tools
