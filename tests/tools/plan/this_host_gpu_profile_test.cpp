// The GPUs of this host as --micro-batch auto plans for them: NVML's reading (the stand-in
// library, answering as 8x H100 80 GB) gives the count asked for, each GPU's memory (or
// LOCKSTEP_CUDA_DEVICE_MEMORY's cap) and the H100 profile's rates; no GPU is an error.
#include <gtest/gtest.h>

#include "gpu/standin_env.h"
#include "lockstep/core/cuda_device.h"
#include "lockstep/core/error.h"
#include "lockstep/gpu/nvml.h"
#include "tools/plan/machine_profile.h"

namespace lockstep::tools {
namespace {

gpu::GpuState h100s() {
  const testing::StandinEnv env("h100-8x.json");
  return gpu::Nvml().read(gpu::Nvml::Query{.processes = false});
}

TEST(ThisHostGpuProfile, NvmlsGpusWithTheirModelsRates) {
  const gpu::GpuState state = h100s();
  ASSERT_EQ(state.devices.size(), 8u) << state.load_error;
  const MachineProfile machine = this_host_gpu_profile(state, 2);
  EXPECT_EQ(machine.devices, 2);
  EXPECT_FALSE(machine.cpu_devices);
  EXPECT_DOUBLE_EQ(machine.memory_bytes, static_cast<double>(state.devices[0].memory_total));
  EXPECT_DOUBLE_EQ(machine.fp32_flops, named_machine_profile("h100-sxm-8x").fp32_flops);
  EXPECT_NE(machine.description.find("2x NVIDIA H100 80GB HBM3 on this host"), std::string::npos)
      << machine.description;
}

TEST(ThisHostGpuProfile, TheCudaMemoryCapIsWhatEachHas) {
  const gpu::GpuState state = h100s();
  cuda::set_device_memory_limit(int64_t{8} << 30);
  const MachineProfile machine = this_host_gpu_profile(state, 1);
  cuda::set_device_memory_limit(0);
  EXPECT_DOUBLE_EQ(machine.memory_bytes, 8.0 * (1 << 30));
  EXPECT_NE(machine.description.find("LOCKSTEP_CUDA_DEVICE_MEMORY"), std::string::npos) << machine.description;
}

// A cap above the GPU's memory changes nothing, and the description does not claim it does.
TEST(ThisHostGpuProfile, ACapAboveTheGpusMemoryIsNotMentioned) {
  const gpu::GpuState state = h100s();
  cuda::set_device_memory_limit(int64_t{1} << 40);
  const MachineProfile machine = this_host_gpu_profile(state, 1);
  cuda::set_device_memory_limit(0);
  EXPECT_DOUBLE_EQ(machine.memory_bytes, static_cast<double>(state.devices[0].memory_total));
  EXPECT_EQ(machine.description.find("LOCKSTEP_CUDA_DEVICE_MEMORY"), std::string::npos) << machine.description;
}

TEST(ThisHostGpuProfile, NoGpuIsAnError) {
  gpu::GpuState none;
  none.load_error = "libnvidia-ml.so.1: cannot open shared object file";
  try {
    this_host_gpu_profile(none, 1);
    ADD_FAILURE() << "a host without GPUs got a GPU profile";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NVML lists no GPU on this host (libnvidia-ml.so.1"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lockstep::tools
