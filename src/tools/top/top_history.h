// The recent past of each device for the full-screen view: utilization and memory use in
// percent, one value per sample, drawn as sparklines (▁▂▃▄▅▆▇█).
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "tools/top/top_sample.h"

namespace lockstep::tools {

// The block for one percentage: 0 -> ▁, 100 -> █, evenly between (rounded); values
// outside 0..100 are clamped. An empty optional (no reading) is a blank.
std::string spark_block(std::optional<double> percent);
// The last `width` values as blocks, oldest left; fewer values than width are left-padded
// with blanks so the newest sample is always at the right edge.
std::string sparkline(const std::deque<std::optional<double>>& values, size_t width);

class History {
 public:
  explicit History(size_t capacity = 240) : capacity_(capacity) {}
  // Appends the sample's readings: GPUs by NVML index ("gpu0"), CPU cores ("cpu0") and the
  // host's memory ("memory").
  void add(const TopSample& sample);

  struct Series {
    std::deque<std::optional<double>> utilization, memory;
  };
  const Series& of(const std::string& device) const;

 private:
  void push(std::deque<std::optional<double>>& values, std::optional<double> value) const;

  size_t capacity_;
  std::map<std::string, Series> series_;
};

}  // namespace lockstep::tools
