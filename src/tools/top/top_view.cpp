#include "tools/top/top_view.h"

#include "tools/top/top_lines.h"

namespace lockstep::tools {
namespace {

constexpr const char* kIndent = "         ";  // under the NAME column, like the process rows

}  // namespace

std::string fit_columns(const std::string& line, size_t columns) {
  size_t used = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    // A UTF-8 continuation byte (10xxxxxx) belongs to the column already counted.
    if ((static_cast<unsigned char>(line[i]) & 0xC0) == 0x80) continue;
    if (used == columns) return line.substr(0, i);
    ++used;
  }
  return line;
}

std::vector<std::string> screen_lines(const TopSample& sample, const History& history, size_t columns, size_t rows) {
  std::vector<std::string> lines;
  // "q quits" first: a long library path must not push it off a narrow screen.
  lines.push_back("lockstep top  (q quits)  " + local_time(sample.taken) + "  " +
                  (sample.shows_gpus() ? driver_line(sample) : std::string("CPU view")));
  if (sample.shows_gpus()) {
    if (!sample.order_warning.empty()) lines.push_back("WARNING " + sample.order_warning);
    lines.push_back(device_header());
    // Two sparklines side by side fill the width left after their labels.
    const size_t spark = columns > 40 ? (columns - 9 - 5 - 7) / 2 : 8;
    for (size_t i = 0; i < sample.gpus.devices.size(); ++i) {
      const gpu::GpuDevice& device = sample.gpus.devices[i];
      lines.push_back(device_row(device, sample.cuda_index_of(i)));
      const History::Series& past = history.of("gpu" + std::to_string(device.index));
      lines.push_back(std::string(kIndent) + "util " + sparkline(past.utilization, spark) + "  mem " +
                      sparkline(past.memory, spark));
      for (const std::string& row : lease_rows(sample, device)) lines.push_back(row);
      for (const std::string& row : process_rows(device)) lines.push_back(row);
    }
  } else {
    lines.push_back(cpu_view_reason(sample));
    lines.push_back(core_header());
    const size_t spark = columns > 30 ? columns - 15 : 8;
    for (size_t i = 0; i < sample.cpu.core_utilization.size(); ++i)
      lines.push_back(core_row(i, sample.cpu.core_utilization[i]) + "  " +
                      sparkline(history.of("cpu" + std::to_string(i)).utilization, spark));
    lines.push_back(host_memory_row(sample.cpu.memory));
    lines.push_back(std::string(kIndent) + "mem " + sparkline(history.of("memory").memory, spark));
  }
  for (const Alert& alert : sample.alerts) lines.push_back(alert_row(alert));
  // Alerts matter more than the last rows of a long process list: keep them when cutting.
  if (lines.size() > rows) {
    const size_t alerts = std::min(sample.alerts.size(), rows / 2);
    std::vector<std::string> cut(lines.begin(), lines.begin() + static_cast<std::ptrdiff_t>(rows - alerts));
    cut.insert(cut.end(), lines.end() - static_cast<std::ptrdiff_t>(alerts), lines.end());
    lines = std::move(cut);
  }
  for (std::string& line : lines) line = fit_columns(line, columns);
  return lines;
}

std::string frame_bytes(const std::vector<std::string>& lines) {
  std::string bytes = "\x1b[H";
  for (size_t i = 0; i < lines.size(); ++i) {
    bytes += lines[i];
    bytes += "\x1b[K";
    if (i + 1 < lines.size()) bytes += "\r\n";
  }
  return bytes + "\x1b[J";
}

}  // namespace lockstep::tools
