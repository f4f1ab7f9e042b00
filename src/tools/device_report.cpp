#include "tools/device_report.h"

#include <algorithm>
#include <cstdio>

namespace lockstep::tools {
namespace {

double busy(const parallel::DeviceTimes& t) { return t.compute + t.wait + t.communicate + t.optimizer; }

double share(double part, double whole) { return whole > 0 ? part / whole : 0.0; }

}  // namespace

DeviceReport::DeviceReport(const std::vector<std::string>& names, const std::string& trace_path)
    : totals_(names.size()) {
  if (trace_path.empty()) return;
  trace_ = std::make_unique<ChromeTrace>(trace_path);
  for (size_t d = 0; d < names.size(); ++d) trace_->name_track(static_cast<int>(d), names[d]);
}

void DeviceReport::add_step(const std::vector<parallel::DeviceTimes>& step) {
  if (origin_ < 0 && !step.empty()) origin_ = step.front().started;
  for (size_t d = 0; d < step.size() && d < totals_.size(); ++d) {
    const parallel::DeviceTimes& t = step[d];
    totals_[d].compute += t.compute;
    totals_[d].wait += t.wait;
    totals_[d].communicate += t.communicate;
    totals_[d].optimizer += t.optimizer;
    if (trace_) {
      const int track = static_cast<int>(d);
      double at = t.started - origin_;
      for (const auto& [name, seconds] : {std::pair<const char*, double>{"compute", t.compute},
                                          {"wait", t.wait},
                                          {"all-reduce", t.communicate},
                                          {"optimizer", t.optimizer}}) {
        trace_->span(track, name, at, seconds);
        at += seconds;
      }
    }
  }
  ++steps_;
}

nlohmann::json DeviceReport::step_json(const std::vector<parallel::DeviceTimes>& step) {
  nlohmann::json out = nlohmann::json::array();
  for (const parallel::DeviceTimes& t : step) {
    out.push_back(
        {{"compute_s", t.compute}, {"wait_s", t.wait}, {"communicate_s", t.communicate}, {"optimizer_s", t.optimizer}});
  }
  return out;
}

nlohmann::json DeviceReport::json(const std::vector<std::string>& names, const std::vector<DeviceTotals>& totals) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t d = 0; d < totals.size(); ++d) {
    const parallel::DeviceTimes& t = totals[d].times;
    out.push_back({{"device", names.at(d)},
                   {"compute_s", t.compute},
                   {"wait_s", t.wait},
                   {"communicate_s", t.communicate},
                   {"optimizer_s", t.optimizer},
                   {"communicate_share", share(t.communicate, busy(t))},
                   {"wait_share", share(t.wait, busy(t))},
                   {"peak_memory_bytes", totals[d].peak_bytes}});
  }
  return out;
}

std::string DeviceReport::table(const std::vector<std::string>& names, const std::vector<DeviceTotals>& totals,
                                int64_t steps) {
  if (totals.empty() || steps == 0) return "";
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "%-8s %12s %12s %12s %12s %8s %8s %10s\n", "device", "compute s", "wait s",
                "all-reduce s", "optimizer s", "wait", "comm", "peak MiB");
  out += line;
  size_t slowest = 0;
  double communicate = 0, total = 0, compute_sum = 0;
  for (size_t d = 0; d < totals.size(); ++d) {
    const parallel::DeviceTimes& t = totals[d].times;
    std::snprintf(line, sizeof(line), "%-8s %12.3f %12.3f %12.3f %12.3f %7.1f%% %7.1f%% %10.1f\n", names.at(d).c_str(),
                  t.compute, t.wait, t.communicate, t.optimizer, 100 * share(t.wait, busy(t)),
                  100 * share(t.communicate, busy(t)), static_cast<double>(totals[d].peak_bytes) / (1 << 20));
    out += line;
    if (t.compute > totals[slowest].times.compute) slowest = d;
    communicate += t.communicate;
    total += busy(t);
    compute_sum += t.compute;
  }
  const double mean_compute = compute_sum / static_cast<double>(totals.size());
  std::snprintf(line, sizeof(line),
                "slowest device %s (compute %+.1f%% against the mean); communication %.1f%% of device time over %lld "
                "steps\n",
                names.at(slowest).c_str(), 100 * share(totals[slowest].times.compute - mean_compute, mean_compute),
                100 * share(communicate, total), static_cast<long long>(steps));
  out += line;
  return out;
}

}  // namespace lockstep::tools
