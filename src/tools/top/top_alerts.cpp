#include "tools/top/top_alerts.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>

#include "lockstep/gpu/xid_log.h"

namespace lockstep::tools {
namespace {

std::string percent(double fraction) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f%%", 100.0 * fraction);
  return text;
}

std::string device_list(const std::set<unsigned>& devices) {
  std::string text;
  for (unsigned d : devices) {
    if (!text.empty()) text += ',';
    text += std::to_string(d);
  }
  return text;
}

void add_imbalance_alerts(const gpu::GpuState& state, const AlertRules& rules, std::vector<Alert>& alerts) {
  // (user, command) -> the GPUs that job runs on.
  std::map<std::pair<std::string, std::string>, std::set<unsigned>> jobs;
  for (const gpu::GpuDevice& device : state.devices)
    for (const gpu::GpuProcess& process : device.processes)
      if (process.in_this_namespace && !process.command.empty())
        jobs[{process.user, process.command}].insert(device.index);
  for (const auto& [job, indexes] : jobs) {
    if (indexes.size() < 2) continue;
    unsigned low = 101, high = 0, low_device = 0, high_device = 0;
    for (const gpu::GpuDevice& device : state.devices) {
      if (!indexes.count(device.index) || !device.utilization_gpu) continue;
      if (*device.utilization_gpu < low) low = *device.utilization_gpu, low_device = device.index;
      if (*device.utilization_gpu > high) high = *device.utilization_gpu, high_device = device.index;
    }
    if (low > high || high - low < rules.imbalance_points) continue;
    alerts.push_back({"imbalance", std::vector<unsigned>(indexes.begin(), indexes.end()),
                      "load imbalance: GPUs " + device_list(indexes) + " run one job (" + job.first + ": " +
                          job.second + ") but GPU " + std::to_string(low_device) + " is at " + std::to_string(low) +
                          "% and GPU " + std::to_string(high_device) + " at " + std::to_string(high) + "%"});
  }
}

}  // namespace

std::vector<Alert> find_alerts(const gpu::GpuState& state, const AlertRules& rules) {
  std::vector<Alert> alerts;
  for (const gpu::GpuDevice& device : state.devices) {
    const std::string gpu = "GPU " + std::to_string(device.index);
    if (device.memory_total > 0) {
      const double used = static_cast<double>(device.memory_used) / static_cast<double>(device.memory_total);
      if (used > rules.memory_fraction)
        alerts.push_back({"memory",
                          {device.index},
                          gpu + " memory " + percent(used) + " full (" + std::to_string(device.memory_used >> 20) +
                              " of " + std::to_string(device.memory_total >> 20) + " MiB)"});
    }
    if (device.throttle_reasons && gpu::is_thermal_throttle(*device.throttle_reasons))
      alerts.push_back({"thermal",
                        {device.index},
                        gpu + " thermal throttling (" + gpu::throttle_reason_names(*device.throttle_reasons) +
                            (device.temperature_c ? ", " + std::to_string(*device.temperature_c) + "C" : "") + ")"});
    if (device.throttle_reasons && gpu::is_power_throttle(*device.throttle_reasons))
      alerts.push_back(
          {"power",
           {device.index},
           gpu + " power throttling (" + gpu::throttle_reason_names(*device.throttle_reasons) +
               (device.power_mw && device.power_limit_mw ? ", " + std::to_string(*device.power_mw / 1000) + " of " +
                                                               std::to_string(*device.power_limit_mw / 1000) + " W"
                                                         : "") +
               ")"});
  }
  add_imbalance_alerts(state, rules, alerts);
  return alerts;
}

std::vector<Alert> xid_alerts(const TopSample& sample) {
  std::vector<Alert> alerts;
  for (const gpu::GpuDevice& device : sample.gpus.devices) {
    const std::optional<XidTally> tally = sample.xids_of(device);
    if (!tally || tally->count == 0) continue;
    const gpu::XidMeaning meaning = gpu::xid_meaning(tally->last);
    alerts.push_back({"xid",
                      {device.index},
                      "GPU " + std::to_string(device.index) + ": " + std::to_string(tally->count) + " Xid error" +
                          (tally->count == 1 ? "" : "s") + " in the kernel log, the last Xid " +
                          std::to_string(tally->last) + (meaning.text.empty() ? "" : " (" + meaning.text + ")") +
                          (meaning.serious ? ": the GPU needs a reset or service (lockstep doctor)" : "")});
  }
  return alerts;
}

}  // namespace lockstep::tools
