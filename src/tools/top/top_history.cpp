#include "tools/top/top_history.h"

#include <algorithm>
#include <cmath>

namespace lockstep::tools {

std::string spark_block(std::optional<double> percent) {
  static const char* const kBlocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  if (!percent || std::isnan(*percent)) return " ";
  const double clamped = std::clamp(*percent, 0.0, 100.0);
  return kBlocks[static_cast<int>(std::lround(clamped * 7.0 / 100.0))];
}

std::string sparkline(const std::deque<std::optional<double>>& values, size_t width) {
  std::string line;
  const size_t shown = std::min(values.size(), width);
  line.append(width - shown, ' ');
  for (size_t i = values.size() - shown; i < values.size(); ++i) line += spark_block(values[i]);
  return line;
}

void History::push(std::deque<std::optional<double>>& values, std::optional<double> value) const {
  values.push_back(value);
  while (values.size() > capacity_) values.pop_front();
}

void History::add(const TopSample& sample) {
  if (sample.shows_gpus()) {
    for (const gpu::GpuDevice& device : sample.gpus.devices) {
      Series& s = series_["gpu" + std::to_string(device.index)];
      push(s.utilization, device.utilization_gpu ? std::optional<double>(*device.utilization_gpu) : std::nullopt);
      push(s.memory, device.memory_total > 0 ? std::optional<double>(100.0 * static_cast<double>(device.memory_used) /
                                                                     static_cast<double>(device.memory_total))
                                             : std::nullopt);
    }
    return;
  }
  for (size_t i = 0; i < sample.cpu.core_utilization.size(); ++i)
    push(series_["cpu" + std::to_string(i)].utilization, sample.cpu.core_utilization[i]);
  const HostMemory& memory = sample.cpu.memory;
  push(series_["memory"].memory, memory.total > 0 ? std::optional<double>(100.0 * static_cast<double>(memory.used()) /
                                                                          static_cast<double>(memory.total))
                                                  : std::nullopt);
}

const History::Series& History::of(const std::string& device) const {
  static const Series kEmpty;
  const auto it = series_.find(device);
  return it == series_.end() ? kEmpty : it->second;
}

}  // namespace lockstep::tools
