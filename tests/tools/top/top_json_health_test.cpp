// `lockstep top --json`'s health readings that stay put between samples (the SM's highest
// clock, the GPU's own PCIe generation, persistence, ECC, retired pages, remapped rows, the
// fabric), which scripts/smi_xml_compare.py sets beside `nvidia-smi -q -x`. The expected
// values are each stand-in profile's own: its defaults with the device's object merged over
// them, as the stand-in reads it (docs/nvml-standin.md); one case no profile has is built by
// hand.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tools/common/command_testing.h"
#include "tools/top/top_json.h"
#include "tools/top/top_testing.h"

namespace lockstep {
namespace {

using namespace command_testing;

// A Gen5 GPU in a Gen4 slot: the link's highest generation and the GPU's own part (every
// stand-in profile has them equal, so this one is built by hand).
TEST(TopJsonHealth, TheGpusOwnPcieGenerationBesideTheLinks) {
  top_testing::TopSample sample = top_testing::two_gpu_sample();
  sample.gpus.devices[0].pcie_generation_max = 4;
  sample.gpus.devices[0].pcie_generation_gpu_max = 5;
  sample.gpus.devices[0].sm_clock_max_mhz = 1980;
  const auto gpu = tools::sample_json(sample)["gpus"][0];
  EXPECT_EQ(gpu["pcie"]["generation_max"], 4) << gpu;
  EXPECT_EQ(gpu["pcie"]["generation_gpu_max"], 5) << gpu;
  EXPECT_EQ(gpu["sm_clock_max_mhz"], 1980) << gpu;
  EXPECT_TRUE(tools::sample_json(sample)["gpus"][1]["sm_clock_max_mhz"].is_null()) << "not read: null";
}

#if defined(LOCKSTEP_NVML_STANDIN)
nlohmann::json profile_device(const std::string& profile, size_t index) {
  std::ifstream in(std::string(LOCKSTEP_NVML_PROFILES) + "/" + profile);
  const auto file = nlohmann::json::parse(in);
  nlohmann::json device = file["defaults"];
  device.merge_patch(file["devices"].at(index));
  return device;
}

// The GPUs of one `top --json --once` sample under a profile.
nlohmann::json top_gpus(const std::string& profile) {
  const Result r = run_shell(std::string("env LOCKSTEP_NVML_LIBRARY=") + LOCKSTEP_NVML_STANDIN +
                             " LOCKSTEP_NVML_PROFILE=" + LOCKSTEP_NVML_PROFILES + "/" + profile + " " + kBinary +
                             " top --json --once </dev/null 2>/dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output)["gpus"];
}

// DGX H100: ECC on and clean, rows remapped on GPU 2 only, every GPU registered with the
// fabric; Hopper retires no pages.
TEST(TopJsonHealth, H100sRemapRowsAndJoinTheFabric) {
  const auto gpus = top_gpus("h100-8x.json");
  ASSERT_EQ(gpus.size(), 8u);
  for (size_t i : {size_t{0}, size_t{2}}) {
    const auto profile = profile_device("h100-8x.json", i);
    const auto& gpu = gpus[i];
    EXPECT_EQ(gpu["sm_clock_max_mhz"], profile["sm_clock_max_mhz"]) << gpu;
    EXPECT_EQ(gpu["pcie"]["generation_gpu_max"], profile["pcie"]["gpu_generation_max"]) << gpu;
    EXPECT_EQ(gpu["persistence_mode"], profile["persistence_mode"]) << gpu;
    EXPECT_EQ(gpu["ecc"]["enabled"], profile["ecc"]["enabled"]) << gpu;
    EXPECT_EQ(gpu["ecc"]["corrected_volatile"], profile["ecc"]["corrected_volatile"]) << gpu;
    EXPECT_EQ(gpu["ecc"]["uncorrected_volatile"], profile["ecc"]["uncorrected_volatile"]) << gpu;
    EXPECT_TRUE(gpu["retired_pages"].is_null()) << gpu;
    EXPECT_EQ(gpu["remapped_rows"]["correctable"], profile["remapped_rows"]["correctable"]) << gpu;
    EXPECT_EQ(gpu["remapped_rows"]["uncorrectable"], profile["remapped_rows"]["uncorrectable"]) << gpu;
    EXPECT_EQ(gpu["remapped_rows"]["pending"], profile["remapped_rows"]["pending"]) << gpu;
    EXPECT_EQ(gpu["remapped_rows"]["failure"], profile["remapped_rows"]["failure"]) << gpu;
    EXPECT_EQ(gpu["fabric"], nlohmann::json({{"state", "completed"}, {"error", ""}})) << gpu;
  }
  EXPECT_EQ(gpus[2]["remapped_rows"]["correctable"], 3) << "the profile's GPU 2 has 3 rows remapped";
  EXPECT_EQ(gpus[0]["remapped_rows"]["correctable"], 0);
}

// 2x V100 with persistence off; GPU 1 with ECC errors and 1 + 2 retired pages, one pending.
// Volta remaps no rows and has no fabric.
TEST(TopJsonHealth, V100sRetirePagesAndCountEccErrors) {
  const auto gpus = top_gpus("ecc-throttle.json");
  ASSERT_EQ(gpus.size(), 2u);
  const auto profile = profile_device("ecc-throttle.json", 1);
  const auto& gpu = gpus[1];
  EXPECT_EQ(gpu["persistence_mode"], false) << gpu;
  EXPECT_EQ(gpu["ecc"]["enabled"], true) << gpu;
  EXPECT_EQ(gpu["ecc"]["corrected_volatile"], profile["ecc"]["corrected_volatile"]) << gpu;
  EXPECT_EQ(gpu["ecc"]["uncorrected_volatile"], profile["ecc"]["uncorrected_volatile"]) << gpu;
  EXPECT_EQ(gpu["retired_pages"]["count"],
            profile["retired_pages"]["single_bit"].get<int>() + profile["retired_pages"]["double_bit"].get<int>())
      << gpu;
  EXPECT_EQ(gpu["retired_pages"]["pending"], true) << gpu;
  EXPECT_EQ(gpus[0]["retired_pages"], nlohmann::json({{"count", 0}, {"pending", false}})) << gpus[0];
  EXPECT_TRUE(gpu["remapped_rows"].is_null()) << gpu;
  EXPECT_TRUE(gpu["fabric"].is_null()) << gpu;
  EXPECT_EQ(gpu["sm_clock_max_mhz"], profile["sm_clock_max_mhz"]) << gpu;
}

// ECC off: the mode is known, the counters are not read (NVML has none to give).
TEST(TopJsonHealth, EccOffLeavesTheCountersNull) {
  const auto gpus = top_gpus("shared-server.json");
  ASSERT_FALSE(gpus.empty());
  EXPECT_EQ(gpus[0]["ecc"]["enabled"], false) << gpus[0];
  EXPECT_TRUE(gpus[0]["ecc"]["corrected_volatile"].is_null()) << gpus[0];
  EXPECT_TRUE(gpus[0]["ecc"]["uncorrected_volatile"].is_null()) << gpus[0];
}

// A GPU the fabric manager is still registering says so; its neighbours are done.
TEST(TopJsonHealth, FabricRegistrationInProgress) {
  const auto gpus = top_gpus("hgx-h100-faults.json");
  ASSERT_EQ(gpus.size(), 4u);
  EXPECT_EQ(gpus[3]["fabric"]["state"], "in_progress") << gpus[3];
  EXPECT_EQ(gpus[0]["fabric"]["state"], "completed") << gpus[0];
}

// The keys scripts and logs read already keep their names and places.
TEST(TopJsonHealth, EarlierKeysStay) {
  const auto gpu = top_gpus("h100-8x.json").at(0);
  for (const char* key : {"index",
                          "cuda_index",
                          "name",
                          "uuid",
                          "pci_bus_id",
                          "utilization_gpu",
                          "utilization_memory",
                          "memory_used",
                          "memory_total",
                          "memory_reserved",
                          "temperature_c",
                          "power_w",
                          "power_limit_w",
                          "sm_clock_mhz",
                          "memory_clock_mhz",
                          "energy_mj",
                          "pcie",
                          "throttle_reasons",
                          "gpm",
                          "processes",
                          "unavailable",
                          "xid_last",
                          "xid_errors"})
    EXPECT_TRUE(gpu.contains(key)) << key;
  for (const char* key : {"generation", "generation_max", "width", "width_max", "tx_kb_per_s", "rx_kb_per_s"})
    EXPECT_TRUE(gpu["pcie"].contains(key)) << key;
}
#endif

}  // namespace
}  // namespace lockstep
