#include "tools/train/device_report.h"

#include <algorithm>
#include <cstdio>
#include <string_view>

namespace lockstep::tools {
namespace {

double share(double part, double whole) { return whole > 0 ? part / whole : 0.0; }

}  // namespace

namespace {

std::string rank_trace_path(const std::string& path, int rank) {
  return rank == 0 ? path : path + ".rank" + std::to_string(rank);
}

}  // namespace

DeviceReport::DeviceReport(const std::vector<std::string>& names, const std::string& trace_path, int rank, int ranks)
    : totals_(names.size()), trace_path_(trace_path), rank_(rank), ranks_(ranks) {
  if (trace_path.empty()) return;
  trace_ = std::make_unique<ChromeTrace>(rank_trace_path(trace_path, rank), rank);
  if (ranks > 1) trace_->name_process("rank " + std::to_string(rank));
  for (size_t d = 0; d < names.size(); ++d) trace_->name_track(static_cast<int>(d), names[d]);
}

void DeviceReport::close_trace() {
  if (trace_) trace_->close();
}

void DeviceReport::merge_rank_traces() {
  if (!trace_ || rank_ != 0 || ranks_ == 1) return;
  // Reopened for appending: close_trace() ended the file.
  ChromeTrace merged(trace_path_ + ".merging");
  merged.merge(trace_path_);
  for (int r = 1; r < ranks_; ++r) {
    const std::string part = rank_trace_path(trace_path_, r);
    if (std::FILE* probe = std::fopen(part.c_str(), "r")) {
      std::fclose(probe);
      merged.merge(part);
    } else {
      // A rank on another host wrote its part there.
      std::fprintf(stderr, "lockstep train: rank %d's trace is not here (%s): it stays on its host\n", r, part.c_str());
    }
  }
  merged.close();
  std::rename((trace_path_ + ".merging").c_str(), trace_path_.c_str());
}

void DeviceReport::add_step(const std::vector<parallel::DeviceTimes>& step, int64_t number) {
  if (origin_ < 0 && !step.empty()) origin_ = step.front().started;
  for (size_t d = 0; d < step.size() && d < totals_.size(); ++d) {
    const parallel::DeviceTimes& t = step[d];
    totals_[d].compute += t.compute;
    totals_[d].wait += t.wait;
    totals_[d].communicate += t.communicate;
    totals_[d].bubble += t.bubble;
    totals_[d].optimizer += t.optimizer;
    if (trace_) {
      const int track = static_cast<int>(d);
      double at = t.started - origin_;
      // A pipeline stage's idle time falls between its passes; the trace shows it as one span.
      for (const auto& [name, seconds] : {std::pair<const char*, double>{"compute", t.compute},
                                          {"pipeline bubble", t.bubble},
                                          {"wait", t.wait},
                                          {"all-reduce", t.communicate},
                                          {"optimizer", t.optimizer}}) {
        if (seconds == 0 && name == std::string_view("pipeline bubble")) continue;  // not a pipeline
        trace_->span(track, name, at, seconds, number);
        at += seconds;
      }
    }
  }
  ++steps_;
}

nlohmann::json DeviceReport::step_json(const std::vector<parallel::DeviceTimes>& step) {
  nlohmann::json out = nlohmann::json::array();
  for (const parallel::DeviceTimes& t : step) {
    out.push_back({{"compute_s", t.compute},
                   {"bubble_s", t.bubble},
                   {"wait_s", t.wait},
                   {"communicate_s", t.communicate},
                   {"optimizer_s", t.optimizer}});
  }
  return out;
}

nlohmann::json DeviceReport::json(const std::vector<std::string>& names, const std::vector<DeviceTotals>& totals) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t d = 0; d < totals.size(); ++d) {
    const parallel::DeviceTimes& t = totals[d].times;
    out.push_back({{"device", names.at(d)},
                   {"compute_s", t.compute},
                   {"bubble_s", t.bubble},
                   {"wait_s", t.wait},
                   {"communicate_s", t.communicate},
                   {"optimizer_s", t.optimizer},
                   {"bubble_share", share(t.bubble, t.busy())},
                   {"communicate_share", share(t.communicate, t.busy())},
                   {"wait_share", share(t.wait, t.busy())},
                   {"peak_memory_bytes", totals[d].peak_bytes}});
  }
  return out;
}

std::string DeviceReport::table(const std::vector<std::string>& names, const std::vector<DeviceTotals>& totals,
                                int64_t steps) {
  if (totals.empty() || steps == 0) return "";
  std::string out;
  char line[256];
  // Pipeline layouts add the time each stage sat idle between its passes.
  const bool pipeline =
      std::any_of(totals.begin(), totals.end(), [](const DeviceTotals& t) { return t.times.bubble > 0; });
  std::snprintf(line, sizeof(line), "%-8s %12s ", "device", "compute s");
  out += line;
  if (pipeline) {
    std::snprintf(line, sizeof(line), "%12s ", "bubble s");
    out += line;
  }
  std::snprintf(line, sizeof(line), "%12s %12s %12s %8s %8s ", "wait s", "all-reduce s", "optimizer s", "wait", "comm");
  out += line;
  if (pipeline) {
    std::snprintf(line, sizeof(line), "%8s ", "bubble");
    out += line;
  }
  std::snprintf(line, sizeof(line), "%10s\n", "peak MiB");
  out += line;
  size_t slowest = 0;
  double communicate = 0, total = 0, compute_sum = 0;
  for (size_t d = 0; d < totals.size(); ++d) {
    const parallel::DeviceTimes& t = totals[d].times;
    std::snprintf(line, sizeof(line), "%-8s %12.3f ", names.at(d).c_str(), t.compute);
    out += line;
    if (pipeline) {
      std::snprintf(line, sizeof(line), "%12.3f ", t.bubble);
      out += line;
    }
    std::snprintf(line, sizeof(line), "%12.3f %12.3f %12.3f %7.1f%% %7.1f%% ", t.wait, t.communicate, t.optimizer,
                  100 * share(t.wait, t.busy()), 100 * share(t.communicate, t.busy()));
    out += line;
    if (pipeline) {
      std::snprintf(line, sizeof(line), "%7.1f%% ", 100 * share(t.bubble, t.busy()));
      out += line;
    }
    std::snprintf(line, sizeof(line), "%10.1f\n", static_cast<double>(totals[d].peak_bytes) / (1 << 20));
    out += line;
    if (t.compute > totals[slowest].times.compute) slowest = d;
    communicate += t.communicate;
    total += t.busy();
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
