#include "tools/top/cpu_usage.h"

#include <cctype>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

std::string read_file(const char* path) {
  std::ifstream in(path);
  LOCKSTEP_CHECK(in) << "cannot read " << path << " (top's CPU view needs Linux's /proc)";
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

uint64_t now_ms() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

}  // namespace

std::vector<CpuTimes> parse_proc_stat(const std::string& text) {
  std::vector<CpuTimes> cores;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    // "cpu0 ..." lines only: "cpu " is the sum of all cores.
    if (line.size() < 4 || line.compare(0, 3, "cpu") != 0 || !std::isdigit(static_cast<unsigned char>(line[3])))
      continue;
    std::istringstream fields(line.substr(line.find(' ')));
    // user nice system idle iowait irq softirq steal: older kernels stop early, the rest read 0.
    uint64_t value[8] = {};
    for (uint64_t& v : value)
      if (!(fields >> v)) break;
    const auto [user, nice, system, idle, iowait, irq, softirq, steal] = value;
    CpuTimes t;
    t.busy = user + nice + system + irq + softirq + steal;
    t.total = t.busy + idle + iowait;
    cores.push_back(t);
  }
  return cores;
}

std::vector<double> core_utilization(const std::vector<CpuTimes>& before, const std::vector<CpuTimes>& after) {
  std::vector<double> percent(after.size(), 0.0);
  for (size_t i = 0; i < after.size() && i < before.size(); ++i) {
    // Counters only grow; a core that went offline and back can restart them.
    if (after[i].total <= before[i].total || after[i].busy < before[i].busy) continue;
    percent[i] = 100.0 * static_cast<double>(after[i].busy - before[i].busy) /
                 static_cast<double>(after[i].total - before[i].total);
  }
  return percent;
}

HostMemory parse_meminfo(const std::string& text) {
  HostMemory memory;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string key;
    uint64_t kib = 0;
    if (!(fields >> key >> kib)) continue;
    if (key == "MemTotal:") memory.total = kib * 1024;
    if (key == "MemAvailable:") memory.available = kib * 1024;
  }
  return memory;
}

CpuReader::CpuReader() : previous_(parse_proc_stat(read_file("/proc/stat"))), previous_at_ms_(now_ms()) {}

CpuSample CpuReader::read() {
  // Ticks are 10 ms: a shorter window would read mostly noise.
  constexpr uint64_t kMinWindowMs = 100;
  const uint64_t elapsed = now_ms() - previous_at_ms_;
  if (elapsed < kMinWindowMs) std::this_thread::sleep_for(std::chrono::milliseconds(kMinWindowMs - elapsed));
  std::vector<CpuTimes> now = parse_proc_stat(read_file("/proc/stat"));
  CpuSample sample;
  sample.core_utilization = core_utilization(previous_, now);
  sample.memory = parse_meminfo(read_file("/proc/meminfo"));
  previous_ = std::move(now);
  previous_at_ms_ = now_ms();
  return sample;
}

}  // namespace lockstep::tools
