#include "lockstep/core/device.h"

#include <sched.h>
#include <unistd.h>

#include <ostream>
#include <thread>

#include "lockstep/core/error.h"

namespace lockstep {

Device Device::parse(const std::string& text) {
  auto fail = [&]() {
    LOCKSTEP_FAIL() << "bad device '" << text << "': expected cpu, cpu:N or cuda:N (N = 0, 1, ...)";
  };
  std::string kind = text;
  int index = 0;
  const auto colon = text.find(':');
  if (colon != std::string::npos) {
    kind = text.substr(0, colon);
    const std::string number = text.substr(colon + 1);
    if (number.empty() || number.size() > 6 || number.find_first_not_of("0123456789") != std::string::npos) fail();
    index = std::stoi(number);
  }
  if (kind == "cpu") return Device(DeviceType::cpu, index);
  if (kind == "cuda") return Device(DeviceType::cuda, index);
  fail();
  return {};
}

std::string Device::str() const { return std::string(is_cpu() ? "cpu:" : "cuda:") + std::to_string(index_); }

std::ostream& operator<<(std::ostream& out, const Device& device) { return out << device.str(); }

int host_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int count = CPU_COUNT(&set);
    if (count > 0) return count;
  }
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

}  // namespace lockstep
