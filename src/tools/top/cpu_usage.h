// What `lockstep top` shows on a host with no NVIDIA GPU: the CPU cores' utilization,
// from the difference of two /proc/stat readings, and the host's memory from /proc/meminfo.
// Parsing is separate from reading so the tests can feed fixture text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::tools {

// One line of /proc/stat ("cpu3 user nice system idle iowait irq softirq steal ..."), in
// clock ticks since boot.
struct CpuTimes {
  uint64_t busy = 0;   // user + nice + system + irq + softirq + steal (guest is inside user)
  uint64_t total = 0;  // busy + idle + iowait
};

// Per-core times, in /proc/stat's order (cpu0, cpu1, ...); the all-cores line is skipped.
std::vector<CpuTimes> parse_proc_stat(const std::string& text);

// Percent busy of each core between two readings; a core with no ticks between them (or
// one that went offline) reads 0.
std::vector<double> core_utilization(const std::vector<CpuTimes>& before, const std::vector<CpuTimes>& after);

struct HostMemory {
  uint64_t total = 0;      // bytes (MemTotal)
  uint64_t available = 0;  // bytes (MemAvailable: what a new program could get without swapping)
  uint64_t used() const { return total > available ? total - available : 0; }
};
HostMemory parse_meminfo(const std::string& text);

struct CpuSample {
  std::vector<double> core_utilization;  // percent, per core
  HostMemory memory;
};

// Reads /proc/stat and /proc/meminfo; each sample's utilization covers the time since the
// previous one (the first waits a tenth of a second after construction, so --once has one).
class CpuReader {
 public:
  CpuReader();
  CpuSample read();

 private:
  std::vector<CpuTimes> previous_;
  uint64_t previous_at_ms_ = 0;
};

}  // namespace lockstep::tools
