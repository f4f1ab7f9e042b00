// Devices: "cpu:N" splits the host's cores into logical devices (each with its own memory
// accounting and worker threads); "cuda:N" names an NVIDIA GPU. Everything that allocates
// or computes says which device it runs on.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace lockstep {

enum class DeviceType : uint8_t { cpu, cuda };

class Device {
 public:
  constexpr Device() = default;
  constexpr Device(DeviceType type, int index) : type_(type), index_(index) {}
  // Parses "cpu", "cpu:3", "cuda:0"; throws Error with the accepted forms otherwise.
  static Device parse(const std::string& text);
  static constexpr Device cpu(int index = 0) { return Device(DeviceType::cpu, index); }

  DeviceType type() const { return type_; }
  int index() const { return index_; }
  bool is_cpu() const { return type_ == DeviceType::cpu; }
  bool is_cuda() const { return type_ == DeviceType::cuda; }
  std::string str() const;

  friend bool operator==(const Device&, const Device&) = default;

 private:
  DeviceType type_ = DeviceType::cpu;
  int index_ = 0;
};

std::ostream& operator<<(std::ostream& out, const Device& device);

// Whether a kernel on one device can read the other's memory: the same device, or two CPU
// devices (they share the host's memory). A GPU's kernels read only their own device's.
inline bool same_memory(Device a, Device b) { return a == b || (a.is_cpu() && b.is_cpu()); }

// Cores of this host available to the process (its CPU affinity mask).
int host_cores();
// This host's name (gethostname).
std::string host_name();

}  // namespace lockstep

template <>
struct std::hash<lockstep::Device> {
  size_t operator()(const lockstep::Device& d) const noexcept {
    return std::hash<int>()(static_cast<int>(d.type()) * 1024 + d.index());
  }
};
