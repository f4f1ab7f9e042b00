#include "lockstep/gpu/gpu_state.h"

#include <cstdio>
#include <utility>

namespace lockstep::gpu {

namespace {

// Names as NVML's constants spell them, lower case (nvidia-smi -q prints the same words).
constexpr std::pair<uint64_t, const char*> kThrottleNames[] = {
    {kThrottleGpuIdle, "gpu_idle"},
    {kThrottleApplicationsClocksSetting, "applications_clocks_setting"},
    {kThrottleSwPowerCap, "sw_power_cap"},
    {kThrottleHwSlowdown, "hw_slowdown"},
    {kThrottleSyncBoost, "sync_boost"},
    {kThrottleSwThermalSlowdown, "sw_thermal_slowdown"},
    {kThrottleHwThermalSlowdown, "hw_thermal_slowdown"},
    {kThrottleHwPowerBrakeSlowdown, "hw_power_brake_slowdown"},
    {kThrottleDisplayClockSetting, "display_clock_setting"},
};

}  // namespace

std::string throttle_reason_names(uint64_t reasons) {
  if (reasons == 0) return "none";
  std::string names;
  for (const auto& [bit, name] : kThrottleNames) {
    if ((reasons & bit) == 0) continue;
    if (!names.empty()) names += ',';
    names += name;
    reasons &= ~bit;
  }
  if (reasons != 0) {  // bits a newer driver knows and we do not: keep them visible
    char hex[32];
    std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(reasons));
    if (!names.empty()) names += ',';
    names += hex;
  }
  return names;
}

bool is_thermal_throttle(uint64_t reasons) {
  return (reasons & (kThrottleSwThermalSlowdown | kThrottleHwThermalSlowdown)) != 0;
}

bool is_power_throttle(uint64_t reasons) {
  return (reasons & (kThrottleSwPowerCap | kThrottleHwSlowdown | kThrottleHwPowerBrakeSlowdown)) != 0;
}

std::string to_string(const GpuPath& path) {
  switch (path.link) {
    case GpuLink::kSelf:
      return "X";
    case GpuLink::kNvlink:
      return "NV" + std::to_string(path.nvlinks);
    case GpuLink::kPix:
      return "PIX";
    case GpuLink::kPxb:
      return "PXB";
    case GpuLink::kPhb:
      return "PHB";
    case GpuLink::kNode:
      return "NODE";
    case GpuLink::kSys:
      return "SYS";
  }
  return "SYS";
}

}  // namespace lockstep::gpu
