// CUDA's numbering of GPUs, each rule on a hand-built GpuState.
#include "lockstep/gpu/device_order.h"

#include <gtest/gtest.h>

#include "gpu/standin_env.h"

namespace lockstep::gpu {
namespace {

GpuDevice gpu(unsigned index, const std::string& bus_id, int major, int minor, unsigned sms, unsigned max_clock,
              const std::string& uuid) {
  GpuDevice device;
  device.index = index;
  device.pci_bus_id = bus_id;
  device.compute_major = major;
  device.compute_minor = minor;
  device.multiprocessors = sms;
  device.sm_clock_max_mhz = max_clock;
  device.uuid = uuid;
  return device;
}

// A mixed box in NVML (PCI) order: a T4, an A100, a V100, another A100.
GpuState mixed() {
  GpuState state;
  state.devices = {gpu(0, "00000000:3B:00.0", 7, 5, 40, 1590, "GPU-11111111-aaaa-bbbb-cccc-000000000000"),
                   gpu(1, "00000000:5E:00.0", 8, 0, 108, 1410, "GPU-22222222-aaaa-bbbb-cccc-000000000000"),
                   gpu(2, "00000000:86:00.0", 7, 0, 80, 1530, "GPU-22223333-aaaa-bbbb-cccc-000000000000"),
                   gpu(3, "00000000:AF:00.0", 8, 0, 108, 1410, "GPU-44444444-aaaa-bbbb-cccc-000000000000")};
  return state;
}

// Four identical GPUs.
GpuState uniform() {
  GpuState state;
  for (unsigned i = 0; i < 4; ++i)
    state.devices.push_back(gpu(i, "00000000:" + std::string(i < 2 ? "1" : "9") + std::to_string(i) + ":00.0", 8, 0,
                                108, 1410, "GPU-" + std::to_string(i) + "0000000-aaaa-bbbb-cccc-000000000000"));
  return state;
}

using Order = std::vector<unsigned>;

TEST(DeviceOrder, FastestFirstPutsNewerAndBiggerGpusFirstTiesInPciOrder) {
  const CudaDevices cuda = cuda_devices(mixed(), std::nullopt, std::nullopt);
  EXPECT_FALSE(cuda.pci_bus_order);
  EXPECT_EQ(cuda.enumeration, (Order{1, 3, 0, 2}));  // 8.0, 8.0 (PCI order), 7.5, 7.0
  EXPECT_EQ(cuda.visible, cuda.enumeration);
  EXPECT_TRUE(cuda.enumeration_differs_from_nvml());
  ASSERT_EQ(cuda.problems.size(), 1u);
  EXPECT_NE(cuda.problems[0].find("CUDA_DEVICE_ORDER=PCI_BUS_ID"), std::string::npos) << cuda.problems[0];
  EXPECT_EQ(cuda.cuda_index(0), 2u);
  EXPECT_EQ(cuda.cuda_index(1), 0u);
}

TEST(DeviceOrder, SameCapabilityFasterGpuFirst) {
  GpuState state;
  state.devices = {gpu(0, "00000000:01:00.0", 8, 6, 28, 1777, "GPU-a"),   // RTX 3060
                   gpu(1, "00000000:02:00.0", 8, 6, 82, 1695, "GPU-b")};  // RTX 3090
  EXPECT_EQ(cuda_enumeration_order(state, false), (Order{1, 0}));
  EXPECT_EQ(cuda_enumeration_order(state, true), (Order{0, 1}));
}

TEST(DeviceOrder, PciBusIdOrderIsNvmlOrder) {
  const CudaDevices cuda = cuda_devices(mixed(), std::nullopt, std::string("PCI_BUS_ID"));
  EXPECT_TRUE(cuda.pci_bus_order);
  EXPECT_EQ(cuda.enumeration, (Order{0, 1, 2, 3}));
  EXPECT_FALSE(cuda.enumeration_differs_from_nvml());
  EXPECT_TRUE(cuda.problems.empty());
}

TEST(DeviceOrder, PciOrderComesFromBusIdsNotNvmlIndices) {
  GpuState state;
  state.devices = {gpu(0, "00000000:B7:00.0", 8, 0, 108, 1410, "GPU-a"),
                   gpu(1, "00000000:07:00.0", 8, 0, 108, 1410, "GPU-b")};
  EXPECT_EQ(cuda_enumeration_order(state, true), (Order{1, 0}));
}

TEST(DeviceOrder, IdenticalGpusKeepNvmlOrderAndRaiseNoWarning) {
  const CudaDevices cuda = cuda_devices(uniform(), std::nullopt, std::nullopt);
  EXPECT_EQ(cuda.enumeration, (Order{0, 1, 2, 3}));
  EXPECT_TRUE(cuda.problems.empty());
}

TEST(DeviceOrder, UnknownDeviceOrderFallsBackToFastestFirst) {
  const CudaDevices cuda = cuda_devices(uniform(), std::nullopt, std::string("pci_bus_id"));
  EXPECT_FALSE(cuda.pci_bus_order);
  ASSERT_EQ(cuda.problems.size(), 1u);
  EXPECT_NE(cuda.problems[0].find("FASTEST_FIRST"), std::string::npos);
}

TEST(DeviceOrder, VisibleDevicesIndexCudasOrderInTheGivenOrder) {
  const CudaDevices fastest = cuda_devices(mixed(), std::string("2,0"), std::nullopt);
  EXPECT_EQ(fastest.visible, (Order{0, 1}));  // CUDA 2 is the T4 (NVML 0), CUDA 0 the first A100 (NVML 1)
  const CudaDevices by_bus = cuda_devices(mixed(), std::string("3, 1"), std::string("PCI_BUS_ID"));
  EXPECT_EQ(by_bus.visible, (Order{3, 1}));
  EXPECT_TRUE(by_bus.problems.empty());
  EXPECT_EQ(by_bus.cuda_index(3), 0u);
  EXPECT_EQ(by_bus.cuda_index(0), std::nullopt);
}

TEST(DeviceOrder, UnsetMeansAllEmptyMeansNone) {
  EXPECT_EQ(cuda_devices(uniform(), std::nullopt, std::nullopt).visible.size(), 4u);
  const CudaDevices none = cuda_devices(uniform(), std::string(""), std::nullopt);
  EXPECT_TRUE(none.visible.empty());
  ASSERT_EQ(none.problems.size(), 1u);
  EXPECT_NE(none.problems[0].find("empty"), std::string::npos);
}

TEST(DeviceOrder, FirstInvalidEntryStopsTheList) {
  struct Case {
    std::string value;
    Order visible;
    std::string stopped_at;
  };
  const Case cases[] = {
      {"0,1,7,2", {0, 1}, "entry 3 (\"7\")"},  // out of range
      {"1,x,2", {1}, "entry 2 (\"x\")"},       // not a number
      {"-1", {}, "entry 1 (\"-1\")"},          // the usual way to hide every GPU
      {"0,1,", {0, 1}, "entry 3 (\"\")"},      // trailing comma
      {"2,2", {2}, "entry 2 (\"2\")"},         // repeated
      {"0,MIG-7a1b2c3d-0000-1111-2222-333344445555", {0}, "entry 2"},
      {"1a", {}, "entry 1 (\"1a\")"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.value);
    const CudaDevices cuda = cuda_devices(uniform(), c.value, std::string("PCI_BUS_ID"));
    EXPECT_EQ(cuda.visible, c.visible);
    ASSERT_EQ(cuda.problems.size(), 1u);
    EXPECT_NE(cuda.problems[0].find(c.stopped_at), std::string::npos) << cuda.problems[0];
    EXPECT_NE(cuda.problems[0].find(std::to_string(c.visible.size()) + " GPU"), std::string::npos) << cuda.problems[0];
  }
}

TEST(DeviceOrder, UuidsAndUniquePrefixes) {
  const GpuState state = mixed();
  EXPECT_EQ(cuda_devices(state, std::string("GPU-44444444-aaaa-bbbb-cccc-000000000000,GPU-1111"), std::nullopt).visible,
            (Order{3, 0}));
  EXPECT_EQ(cuda_devices(state, std::string("gpu-2222333"), std::nullopt).visible, (Order{2}));  // case-insensitive
  const CudaDevices ambiguous = cuda_devices(state, std::string("GPU-2222"), std::string("PCI_BUS_ID"));
  EXPECT_TRUE(ambiguous.visible.empty());
  ASSERT_EQ(ambiguous.problems.size(), 1u);
  EXPECT_NE(ambiguous.problems[0].find("more than one"), std::string::npos);
  const CudaDevices unknown = cuda_devices(state, std::string("0,GPU-deadbeef"), std::string("PCI_BUS_ID"));
  EXPECT_EQ(unknown.visible, (Order{0}));
  EXPECT_NE(unknown.problems.at(0).find("matches no GPU"), std::string::npos);
}

TEST(DeviceOrder, ReadsTheEnvironment) {
  lockstep::testing::ScopedEnv visible("CUDA_VISIBLE_DEVICES", std::string("1,0"));
  lockstep::testing::ScopedEnv order("CUDA_DEVICE_ORDER", std::string("PCI_BUS_ID"));
  EXPECT_EQ(cuda_devices_from_environment(mixed()).visible, (Order{1, 0}));
}

}  // namespace
}  // namespace lockstep::gpu
