// Tests parameterized by device: each case runs on cpu:0 and on cuda:0. Without a GPU (or
// in a build without the CUDA backend) the CUDA cases are reported as skipped, with the
// reason, never silently passed.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lockstep/core/cuda_device.h"
#include "lockstep/core/tensor.h"

namespace lockstep::testing {

inline std::vector<Device> test_devices() { return {Device::cpu(0), Device(DeviceType::cuda, 0)}; }

// "cpu" / "cuda", for INSTANTIATE_TEST_SUITE_P's name generator.
inline std::string device_case_name(const ::testing::TestParamInfo<Device>& info) {
  return info.param.is_cpu() ? "cpu" : "cuda";
}

// Why a test on device cannot run here, or "" when it can.
inline std::string missing_device(Device device, int count = 1) {
  if (!device.is_cuda()) return "";
  if (!cuda::built()) return "this build has no CUDA backend";
  if (cuda::device_count() < count) {
    const std::string why = cuda::unavailable_reason();
    return "needs " + std::to_string(count) + " CUDA device(s), this machine has " +
           std::to_string(cuda::device_count()) + (why.empty() ? "" : ": " + why);
  }
  return "";
}

}  // namespace lockstep::testing

// Skips the current test unless `device` (and, for cuda, that many devices) is available;
// under LOCKSTEP_REQUIRE_CUDA=1 (the GPU check) it fails instead, so "no GPU" cannot pass.
#define LOCKSTEP_SKIP_UNLESS_DEVICE(device, ...)                                                                 \
  do {                                                                                                           \
    const std::string lockstep_missing = ::lockstep::testing::missing_device(device __VA_OPT__(, ) __VA_ARGS__); \
    if (!lockstep_missing.empty() && ::lockstep::cuda::cuda_required())                                          \
      FAIL() << lockstep_missing << " (LOCKSTEP_REQUIRE_CUDA=1: a GPU must be there)";                           \
    if (!lockstep_missing.empty()) GTEST_SKIP() << lockstep_missing;                                             \
  } while (0)

// For INSTANTIATE_TEST_SUITE_P(Devices, Suite, LOCKSTEP_TEST_DEVICES).
#define LOCKSTEP_TEST_DEVICES \
  ::testing::ValuesIn(::lockstep::testing::test_devices()), ::lockstep::testing::device_case_name

namespace lockstep::testing {

// The base of a suite whose cases run on each test device (TEST_P, and
// INSTANTIATE_TEST_SUITE_P(Devices, Suite, LOCKSTEP_TEST_DEVICES)): a case whose device is
// missing is skipped, with the reason, before its body runs; no case has to remember to ask.
class DeviceTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { LOCKSTEP_SKIP_UNLESS_DEVICE(GetParam()); }
};

}  // namespace lockstep::testing
