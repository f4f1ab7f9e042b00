// The NVML loader against the stand-in library: every profile's readings must come back
// as the profile file says, read here with plain JSON, independently of the stand-in.
#include "lockstep/gpu/nvml.h"

#include <gtest/gtest.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gpu/standin_env.h"
#include "lockstep/core/error.h"

namespace lockstep::gpu {
namespace {

using lockstep::testing::ScopedEnv;
using lockstep::testing::StandinEnv;
using nlohmann::json;

const char* const kProfiles[] = {"a100-8x-nvlink.json", "h100-8x.json",      "t4-4x-pcie.json",
                                 "shared-server.json",  "ecc-throttle.json", "old-driver.json",
                                 "failing-call.json",   "t4-4x-busy.json",   "hgx-h100-faults.json"};

json read_profile(const std::string& name) {
  std::ifstream file(lockstep::testing::standin_profile_path(name));
  return json::parse(file);
}

// The profile's device `i` with the defaults filled in.
json profile_device(const json& profile, size_t i) {
  json device = profile.value("defaults", json::object());
  device.merge_patch(profile["devices"][i]);
  return device;
}

// A reading's first value (arrays cycle, one step per call); hex strings are bit masks.
uint64_t first(const json& value) {
  const json& v = value.is_array() ? value[0] : value;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_string()) return std::stoull(v.get<std::string>(), nullptr, 16);
  return v.get<uint64_t>();
}

// The code the profile makes `function` fail with on this device, or "" when it succeeds.
std::string failure(const json& profile, const json& device, const std::string& function) {
  if (device.contains("fail") && device["fail"].contains(function)) return device["fail"][function];
  if (profile.contains("fail") && profile["fail"].contains(function)) return profile["fail"][function];
  return "";
}

bool noted(const GpuDevice& device, const std::string& function) {
  for (const auto& entry : device.unavailable) {
    if (entry.rfind(function + ":", 0) == 0) return true;
  }
  return false;
}

std::string joined_argv() {
  std::string command;
  for (const auto& arg : ::testing::internal::GetArgvs()) command += (command.empty() ? "" : " ") + arg;
  return command;
}

void expect_matches(const json& profile, const json& want, const GpuDevice& got) {
  SCOPED_TRACE("device " + std::to_string(got.index) + " " + got.pci_bus_id);
  EXPECT_EQ(got.name, want["name"]);
  EXPECT_EQ(got.uuid, want["uuid"]);
  EXPECT_EQ(got.pci_bus_id, want["pci_bus_id"]);
  EXPECT_EQ(std::to_string(got.compute_major) + "." + std::to_string(got.compute_minor), want["compute_capability"]);
  if (failure(profile, want, "nvmlDeviceGetNumGpuCores").empty()) {
    EXPECT_EQ(got.multiprocessors, want["multiprocessors"].get<unsigned>());
  } else {
    EXPECT_FALSE(got.multiprocessors);
    EXPECT_TRUE(noted(got, "nvmlDeviceGetNumGpuCores"));
  }

  const uint64_t total = first(want["memory"]["total"]), reserved = first(want["memory"]["reserved"]);
  const uint64_t used = first(want["memory"]["used"]);
  const std::string memory_v2 = failure(profile, want, "nvmlDeviceGetMemoryInfo_v2");
  if (memory_v2.empty()) {
    EXPECT_EQ(got.memory_total, total);
    EXPECT_EQ(got.memory_reserved, reserved);
    EXPECT_EQ(got.memory_used, used);
    EXPECT_EQ(got.memory_free, total - reserved - used);
  } else if (memory_v2 == "NVML_ERROR_FUNCTION_NOT_FOUND") {  // v1: reserved counts as used
    EXPECT_EQ(got.memory_total, total);
    EXPECT_EQ(got.memory_reserved, 0u);
    EXPECT_EQ(got.memory_used, used + reserved);
    EXPECT_EQ(got.memory_free, total - reserved - used);
    EXPECT_TRUE(noted(got, "nvmlDeviceGetMemoryInfo_v2"));
  } else {
    EXPECT_EQ(got.memory_total, 0u);
    EXPECT_EQ(got.memory_used, 0u);
    EXPECT_TRUE(noted(got, "nvmlDeviceGetMemoryInfo_v2"));
  }

  EXPECT_EQ(got.utilization_gpu, first(want["utilization"]["gpu"]));
  EXPECT_EQ(got.utilization_memory, first(want["utilization"]["memory"]));
  EXPECT_EQ(got.temperature_c, first(want["temperature_c"]));
  if (failure(profile, want, "nvmlDeviceGetPowerUsage").empty()) {
    EXPECT_EQ(got.power_mw, first(want["power_mw"]));
  } else {
    EXPECT_FALSE(got.power_mw);
    EXPECT_TRUE(noted(got, "nvmlDeviceGetPowerUsage"));
  }
  EXPECT_EQ(got.power_limit_mw, first(want["power_limit_mw"]));
  EXPECT_EQ(got.sm_clock_mhz, first(want["sm_clock_mhz"]));
  EXPECT_EQ(got.sm_clock_max_mhz, first(want["sm_clock_max_mhz"]));
  EXPECT_EQ(got.throttle_reasons, first(want["throttle_reasons"]));
  EXPECT_EQ(got.memory_clock_mhz, first(want["memory_clock_mhz"]));
  EXPECT_EQ(got.energy_mj, first(want["energy_mj"]));
  const json& pcie = want["pcie"];
  EXPECT_EQ(got.pcie_generation, first(pcie["generation"]));
  EXPECT_EQ(got.pcie_generation_max, first(pcie["generation_max"]));
  EXPECT_EQ(got.pcie_generation_gpu_max, first(pcie["gpu_generation_max"]));
  EXPECT_EQ(got.pcie_width, first(pcie["width"]));
  EXPECT_EQ(got.pcie_width_max, first(pcie["width_max"]));
  EXPECT_EQ(got.pcie_tx_kb_per_s, first(pcie["tx_kb_per_s"]));
  EXPECT_EQ(got.pcie_rx_kb_per_s, first(pcie["rx_kb_per_s"]));
  // NVLink GPUs: the counters of their first link (the stand-in's others count none).
  if (got.nvlink_errors) {
    const json errors = want.value("nvlink_errors", json::object());
    EXPECT_EQ(got.nvlink_errors->replay, errors.value("replay", 0u));
    EXPECT_EQ(got.nvlink_errors->recovery, errors.value("recovery", 0u));
    EXPECT_EQ(got.nvlink_errors->crc_flit, errors.value("crc_flit", 0u));
    EXPECT_EQ(got.nvlink_errors->crc_data, errors.value("crc_data", 0u));
    EXPECT_GT(got.nvlink_errors->links, 0u);
  } else {
    EXPECT_FALSE(want.contains("nvlink_errors"));
  }
  EXPECT_EQ(got.behind_nvswitch, got.nvlink_errors.has_value() && profile.value("nvswitch", false));
  if (want.contains("fabric")) {
    const uint64_t state = want["fabric"]["state"];
    ASSERT_TRUE(got.fabric_state);
    EXPECT_EQ(static_cast<int>(*got.fabric_state), static_cast<int>(state) - 1);  // NOT_STARTED is 1
  } else {
    EXPECT_FALSE(got.fabric_state);  // Not Supported: no note
  }
  EXPECT_EQ(got.persistence_mode, want["persistence_mode"].get<bool>());
  const bool ecc = want["ecc"]["enabled"];
  EXPECT_EQ(got.ecc_enabled, ecc);
  if (ecc) {
    EXPECT_EQ(got.ecc_uncorrected_volatile, first(want["ecc"]["uncorrected_volatile"]));
    EXPECT_EQ(got.ecc_corrected_volatile, first(want["ecc"]["corrected_volatile"]));
  } else {
    EXPECT_FALSE(got.ecc_uncorrected_volatile);
  }
  // GPUs before Ampere retire pages; later ones remap rows, and answer Not Supported for
  // the other.
  if (want.contains("retired_pages")) {
    EXPECT_EQ(got.retired_pages,
              first(want["retired_pages"]["single_bit"]) + first(want["retired_pages"]["double_bit"]));
    EXPECT_EQ(got.retired_pages_pending, want["retired_pages"]["pending"].get<bool>());
  } else {
    EXPECT_FALSE(got.retired_pages);  // Not Supported: no note, the GPU remaps rows
  }
  if (want.contains("remapped_rows")) {
    EXPECT_EQ(got.remapped_rows_correctable, first(want["remapped_rows"]["correctable"]));
    EXPECT_EQ(got.remapped_rows_uncorrectable, first(want["remapped_rows"]["uncorrectable"]));
    EXPECT_EQ(got.remap_pending, want["remapped_rows"]["pending"].get<bool>());
    EXPECT_EQ(got.remap_failed, want["remapped_rows"]["failure"].get<bool>());
  } else {
    EXPECT_FALSE(got.remapped_rows_correctable);
  }

  ASSERT_EQ(got.processes.size(), want["processes"].size());
  for (size_t k = 0; k < got.processes.size(); ++k) {
    const json& process = want["processes"][k];
    const bool self = process["pid"].is_string();
    const unsigned pid = self ? static_cast<unsigned>(getpid()) : process["pid"].get<unsigned>();
    EXPECT_EQ(got.processes[k].pid, pid);
    EXPECT_EQ(got.processes[k].used_bytes, process["used_memory"].get<uint64_t>());
    if (process.contains("sm_util")) {
      EXPECT_EQ(got.processes[k].sm_utilization, process["sm_util"].get<unsigned>());
      EXPECT_EQ(got.processes[k].memory_utilization, process["mem_util"].get<unsigned>());
    } else {
      EXPECT_FALSE(got.processes[k].sm_utilization);
    }
    EXPECT_EQ(got.processes[k].in_this_namespace, std::filesystem::exists("/proc/" + std::to_string(pid)));
  }
}

TEST(NvmlStandin, EveryProfileReadsBackAsWritten) {
  for (const char* name : kProfiles) {
    SCOPED_TRACE(name);
    StandinEnv env(name);
    Nvml nvml;
    ASSERT_TRUE(nvml.loaded()) << nvml.load_error();
    const GpuState state = nvml.read({.processes = true, .topology = true});
    const json profile = read_profile(name);
    EXPECT_TRUE(state.loaded());
    EXPECT_EQ(state.library_path, std::filesystem::canonical(LOCKSTEP_NVML_STANDIN).string());
    EXPECT_EQ(state.driver_version, profile["driver_version"]);
    EXPECT_EQ(state.nvml_version, profile["nvml_version"]);
    EXPECT_EQ(state.cuda_driver_version, profile["cuda_driver_version"]);
    ASSERT_EQ(state.devices.size(), profile["devices"].size());
    for (size_t i = 0; i < state.devices.size(); ++i) {
      EXPECT_EQ(state.devices[i].index, i);
      const json device = profile_device(profile, i);
      expect_matches(profile, device, state.devices[i]);
      EXPECT_FALSE(state.devices[i].gpm) << "GPM's activity spans two readings";
      // A profile that fails nothing reads without a single note.
      if (!profile.contains("fail") && !device.contains("fail")) {
        EXPECT_TRUE(state.devices[i].unavailable.empty()) << state.devices[i].unavailable.front();
      }
    }
  }
}

TEST(NvmlStandin, TopologyMatchesTheMatrix) {
  for (const char* name : kProfiles) {
    SCOPED_TRACE(name);
    StandinEnv env(name);
    Nvml nvml;
    const GpuState state = nvml.read({.processes = false, .topology = true});
    const json matrix = read_profile(name)["topology"];
    ASSERT_EQ(state.topology.size(), matrix.size());
    for (size_t i = 0; i < matrix.size(); ++i) {
      ASSERT_EQ(state.topology[i].size(), matrix.size());
      for (size_t j = 0; j < matrix.size(); ++j)
        EXPECT_EQ(to_string(state.topology[i][j]), matrix[i][j]) << i << "," << j;
    }
  }
}

// NVML numbers a GPU's NVLinks from 0 up to NVML_NVLINK_MAX_LINKS (36 since NVML 13): a GPU
// with more than 18 (two of its neighbours at NV12 each here) must have every one counted.
TEST(NvmlStandin, NvlinksPastTheEighteenthAreCounted) {
  json profile = read_profile("t4-4x-pcie.json");
  profile["topology"] = json::array({json::array({"X", "NV24", "SYS", "SYS"}), json::array({"NV24", "X", "SYS", "SYS"}),
                                     json::array({"SYS", "SYS", "X", "PHB"}), json::array({"SYS", "SYS", "PHB", "X"})});
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("lockstep-nvlink-" + std::to_string(getpid()) + ".json");
  std::ofstream(path) << profile.dump();
  {
    StandinEnv env(path.string());
    Nvml nvml;
    const GpuState state = nvml.read({.processes = false, .topology = true});
    ASSERT_EQ(state.topology.size(), 4u);
    EXPECT_EQ(to_string(state.topology[0][1]), "NV24");
    EXPECT_EQ(to_string(state.topology[1][0]), "NV24");
  }
  std::filesystem::remove(path);
}

TEST(NvmlStandin, TopologyOnlyWhenAsked) {
  StandinEnv env("t4-4x-pcie.json");
  Nvml nvml;
  const GpuState state = nvml.read({.processes = false, .topology = false});
  EXPECT_TRUE(state.topology.empty());
  EXPECT_EQ(state.devices.size(), 4u);
  EXPECT_TRUE(state.devices[0].processes.empty());
}

TEST(NvmlStandin, SelfProcessResolvesToThisUserAndCommand) {
  StandinEnv env("shared-server.json");
  Nvml nvml;
  const GpuState state = nvml.read();
  ASSERT_EQ(state.devices.size(), 4u);
  ASSERT_EQ(state.devices[2].processes.size(), 1u);
  const GpuProcess& self = state.devices[2].processes[0];
  EXPECT_EQ(self.pid, static_cast<uint32_t>(getpid()));
  EXPECT_TRUE(self.in_this_namespace);
  EXPECT_EQ(self.uid, getuid());
  if (const passwd* entry = getpwuid(getuid())) {
    EXPECT_EQ(self.user, entry->pw_name);
  }
  EXPECT_EQ(self.command, joined_argv());
  // The other users' jobs run under host PIDs this namespace does not have.
  for (unsigned device : {0u, 1u}) {
    for (const auto& process : state.devices[device].processes) {
      EXPECT_FALSE(process.in_this_namespace) << process.pid;
      EXPECT_TRUE(process.user.empty());
      EXPECT_TRUE(process.command.empty());
    }
  }
}

TEST(NvmlStandin, ReadingsCycleOneStepPerRead) {
  StandinEnv env("a100-8x-nvlink.json");
  const json want = profile_device(read_profile("a100-8x-nvlink.json"), 1);
  Nvml nvml;
  for (size_t step = 0; step < 4; ++step) {
    const GpuState state = nvml.read();
    const json& gpu = want["utilization"]["gpu"];
    EXPECT_EQ(state.devices[1].utilization_gpu, gpu[step % gpu.size()].get<unsigned>()) << step;
    const json& power = want["power_mw"];
    EXPECT_EQ(state.devices[1].power_mw, power[step % power.size()].get<unsigned>()) << step;
  }
}

// GPM's activity between two readings of one Nvml, as fractions of the profile's percents
// (which cycle one step per reading); a metric the profile leaves out stays empty.
TEST(NvmlStandin, GpmActivityFromTheSecondReadingOn) {
  StandinEnv env("h100-8x.json");
  const json want = profile_device(read_profile("h100-8x.json"), 0)["gpm"];
  Nvml nvml;
  EXPECT_FALSE(nvml.read().devices[0].gpm) << "one sample measures nothing";
  for (size_t step = 0; step < 3; ++step) {
    const GpuState state = nvml.read();
    ASSERT_TRUE(state.devices[0].gpm) << step;
    EXPECT_TRUE(state.devices[0].unavailable.empty()) << state.devices[0].unavailable.front();
    const GpmActivity& got = *state.devices[0].gpm;
    const auto at = [&](const char* name) {
      const json& values = want[name];
      return values[step % values.size()].get<double>() / 100;
    };
    EXPECT_EQ(got.graphics_engine, at("graphics_util")) << step;
    EXPECT_EQ(got.sm, at("sm_util")) << step;
    EXPECT_EQ(got.sm_occupancy, at("sm_occupancy")) << step;
    EXPECT_EQ(got.tensor, at("any_tensor_util")) << step;
    EXPECT_EQ(got.dram, at("dram_bw_util")) << step;
    EXPECT_EQ(got.fp32, at("fp32_util")) << step;
    EXPECT_FALSE(got.fp64);
    EXPECT_FALSE(got.fp16);
  }
}

TEST(NvmlStandin, GpusBeforeHopperHaveNoGpmAndNoNote) {
  StandinEnv env("a100-8x-nvlink.json");
  Nvml nvml;
  nvml.read();
  const GpuState second = nvml.read();
  EXPECT_FALSE(second.devices[0].gpm);
  EXPECT_TRUE(second.devices[0].unavailable.empty()) << second.devices[0].unavailable.front();
}

TEST(NvmlStandin, FailingCallsAreNotedNotThrown) {
  StandinEnv env("failing-call.json");
  Nvml nvml;
  const GpuState state = nvml.read();
  ASSERT_EQ(state.devices.size(), 2u);
  for (const auto& device : state.devices) {
    EXPECT_FALSE(device.power_mw);
    EXPECT_TRUE(noted(device, "nvmlDeviceGetPowerUsage"));
    EXPECT_TRUE(device.power_limit_mw);  // the rest still reads
  }
  EXPECT_EQ(state.devices[0].memory_total, 15360ull << 20);
  EXPECT_EQ(state.devices[1].memory_total, 0u);
  EXPECT_NE(std::find(state.devices[1].unavailable.begin(), state.devices[1].unavailable.end(),
                      "nvmlDeviceGetMemoryInfo_v2: Unknown Error"),
            state.devices[1].unavailable.end());
  EXPECT_NE(std::find(state.devices[0].unavailable.begin(), state.devices[0].unavailable.end(),
                      "nvmlDeviceGetPowerUsage: Unknown Error"),
            state.devices[0].unavailable.end());
  // _v3 of the process call answered Function Not Found: _v2 gave the list, and that is no failure.
  ASSERT_EQ(state.devices[0].processes.size(), 1u);
  EXPECT_FALSE(noted(state.devices[0], "nvmlDeviceGetComputeRunningProcesses_v3"));
}

TEST(NvmlStandin, OldDriverFallsBackToOlderCalls) {
  StandinEnv env("old-driver.json");
  Nvml nvml;
  const GpuState state = nvml.read();
  ASSERT_EQ(state.devices.size(), 2u);
  EXPECT_EQ(state.cuda_driver_version, 11040);
  const GpuDevice& device = state.devices[0];
  ASSERT_EQ(device.processes.size(), 1u);  // from the unversioned call
  EXPECT_EQ(device.processes[0].used_bytes, 9840ull << 20);
  EXPECT_EQ(device.throttle_reasons, 0x1u);  // from ...ThrottleReasons
  bool explained = false;
  for (const auto& entry : device.unavailable)
    explained |= entry.find("memory used includes the driver's reserved memory") != std::string::npos;
  EXPECT_TRUE(explained);
}

std::string write_temp_profile(const std::string& name, const json& profile) {
  const std::string path = ::testing::TempDir() + "/" + name + "-" + std::to_string(getpid()) + ".json";
  std::ofstream(path) << profile.dump();
  return path;
}

TEST(NvmlLoader, MissingLibraryIsALoadErrorNamingTheFile) {
  ScopedEnv library("LOCKSTEP_NVML_LIBRARY", std::string("/nonexistent/libnvidia-ml.so.1"));
  Nvml nvml;
  EXPECT_FALSE(nvml.loaded());
  EXPECT_NE(nvml.load_error().find("/nonexistent/libnvidia-ml.so.1"), std::string::npos) << nvml.load_error();
  const GpuState state = nvml.read();
  EXPECT_FALSE(state.loaded());
  EXPECT_EQ(state.load_error, nvml.load_error());
  EXPECT_TRUE(state.devices.empty());
}

TEST(NvmlLoader, ALibraryThatIsNotNvmlIsRefused) {
  ScopedEnv library("LOCKSTEP_NVML_LIBRARY", std::string("libz.so.1"));
  Nvml nvml;
  EXPECT_FALSE(nvml.loaded());
  EXPECT_NE(nvml.load_error().find("nvmlInit_v2"), std::string::npos) << nvml.load_error();
}

TEST(NvmlLoader, FailingInitIsALoadErrorWithNvmlsText) {
  json profile = read_profile("t4-4x-pcie.json");
  profile["fail"] = {{"nvmlInit_v2", "NVML_ERROR_DRIVER_NOT_LOADED"}};
  StandinEnv env(write_temp_profile("init-fails", profile));
  Nvml nvml;
  EXPECT_FALSE(nvml.loaded());
  EXPECT_EQ(nvml.load_error().rfind("nvmlInit_v2: Driver Not Loaded", 0), 0u) << nvml.load_error();
  EXPECT_EQ(nvml.library_path(), std::filesystem::canonical(LOCKSTEP_NVML_STANDIN).string());
  EXPECT_TRUE(nvml.read().devices.empty());
}

TEST(NvmlLoader, FailingDeviceCountThrowsNamingTheCall) {
  json profile = read_profile("t4-4x-pcie.json");
  profile["fail"] = {{"nvmlDeviceGetCount_v2", "NVML_ERROR_GPU_IS_LOST"}};
  StandinEnv env(write_temp_profile("count-fails", profile));
  Nvml nvml;
  ASSERT_TRUE(nvml.loaded());
  try {
    nvml.read();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nvmlDeviceGetCount_v2 failed: GPU is lost"), std::string::npos) << e.what();
  }
}

TEST(NvmlLoader, RepeatedLoadsReadTheProfileAfresh) {
  for (int round = 0; round < 3; ++round) {
    {
      StandinEnv env("a100-8x-nvlink.json");
      Nvml nvml;
      EXPECT_EQ(nvml.read().devices.size(), 8u);
    }
    {
      StandinEnv env("t4-4x-pcie.json");
      Nvml nvml;
      const GpuState state = nvml.read();
      ASSERT_EQ(state.devices.size(), 4u);
      EXPECT_EQ(state.devices[0].name, "Tesla T4");
    }
  }
}

}  // namespace
}  // namespace lockstep::gpu
