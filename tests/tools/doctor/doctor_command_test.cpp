// `lockstep doctor` as a user runs it: without a driver (an NVML library that does not
// exist) it reports the CPU devices and does not fail; --json parses; bad flags are usage
// errors. With the stand-in NVML library (tests/gpu/), each profile gets the statuses the
// rules give it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/core/cuda_device.h"
#include "lockstep/core/device.h"
#include "tools/common/command_testing.h"

namespace lockstep {
namespace {

using namespace command_testing;

const std::string kNoDriver = "env LOCKSTEP_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1 ";

TEST(DoctorCommand, WithoutADriverListsTheCpuDevicesAndDoesNotFail) {
  const Result r = run_shell(kNoDriver + kBinary + " doctor");
  EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 1) << r.output;
  EXPECT_NE(r.output.find("INFO  nvml"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/libnvidia-ml.so.1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cpu:0 … cpu:" + std::to_string(host_cores() - 1)), std::string::npos) << r.output;
  for (const char* name : {"shm", "memlock", "cores", "mpi"}) {
    EXPECT_NE(r.output.find(std::string("  ") + name + " "), std::string::npos) << name << "\n" << r.output;
  }
  EXPECT_EQ(r.output.find("  ecc "), std::string::npos) << "GPU rules need GPUs\n" << r.output;
}

TEST(DoctorCommand, JsonHasTheChecksTheFactsAndTheExitCode) {
  const Result r = run_shell(kNoDriver + kBinary + " doctor --json 2>/dev/null");
  const nlohmann::json out = nlohmann::json::parse(r.output);
  EXPECT_EQ(out["exit_code"].get<int>(), r.exit_code);
  ASSERT_TRUE(out["checks"].is_array());
  EXPECT_EQ(out["checks"][0]["name"], "nvml");
  EXPECT_EQ(out["checks"][0]["status"], "info");
  int worst = 0;
  for (const auto& check : out["checks"]) {
    if (check["status"] == "warn") worst = std::max(worst, 1);
    if (check["status"] == "fail") worst = 2;
  }
  EXPECT_EQ(worst, r.exit_code);
  EXPECT_EQ(out["facts"]["host"]["cores_allowed"].get<int>(), host_cores());
  EXPECT_FALSE(out["facts"]["gpus"]["load_error"].get<std::string>().empty());
}

TEST(DoctorCommand, UnknownFlagIsAUsageError) {
  const Result r = run("doctor --frobnicate");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("frobnicate"), std::string::npos) << r.output;
  EXPECT_EQ(run("doctor --help").exit_code, 0);
}

// --deep on a machine without a CUDA device (this one, or a build without CUDA): the deep
// checks are there, skipped as INFO (never a pass), and the exit code is the one without them.
TEST(DoctorCommand, DeepWithoutACudaDeviceShowsTheDeepChecksSkipped) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "this machine has a CUDA device: --deep runs it";
  const Result plain = run_shell(kNoDriver + kBinary + " doctor --no-python");
  EXPECT_EQ(plain.output.find("peer-copies"), std::string::npos) << "no probe without --deep\n" << plain.output;
  const Result deep = run_shell(kNoDriver + kBinary + " doctor --no-python --deep");
  EXPECT_EQ(deep.exit_code, plain.exit_code) << deep.output;
  EXPECT_TRUE(deep.exit_code == 0 || deep.exit_code == 1) << deep.output;
  for (const std::string name : {"peer-copies", "gemm-burn"}) {
    const size_t at = deep.output.find("INFO  " + name + " ");
    ASSERT_NE(at, std::string::npos) << name << "\n" << deep.output;
    const std::string line = deep.output.substr(at, deep.output.find('\n', at) - at);
    EXPECT_NE(line.find("  skipped: no CUDA device ("), std::string::npos) << line;
  }

  const Result json = run_shell(kNoDriver + kBinary + " doctor --no-python --deep --json 2>/dev/null");
  const nlohmann::json out = nlohmann::json::parse(json.output);
  EXPECT_EQ(out["exit_code"].get<int>(), plain.exit_code);
  EXPECT_EQ(out["facts"]["deep"]["gpus"], 0);
  EXPECT_FALSE(out["facts"]["deep"]["no_device_reason"].get<std::string>().empty());
  EXPECT_TRUE(out["facts"]["deep"]["copies"].empty());
  int deep_checks = 0;
  for (const auto& check : out["checks"]) {
    if (check["name"] == "peer-copies" || check["name"] == "gemm-burn") {
      ++deep_checks;
      EXPECT_EQ(check["status"], "info") << check.dump();
    }
  }
  EXPECT_EQ(deep_checks, 2);
  const Result plain_json = run_shell(kNoDriver + kBinary + " doctor --no-python --json 2>/dev/null");
  EXPECT_TRUE(nlohmann::json::parse(plain_json.output)["facts"]["deep"].is_null());
}

// On a GPU machine: --deep runs them, and --json carries the measurements.
TEST(DoctorCommand, DeepOnCudaDevicesMeasuresEveryGpuAndPair) {
  if (cuda::device_count() == 0) {
    if (cuda::cuda_required()) FAIL() << "LOCKSTEP_REQUIRE_CUDA=1 but no CUDA device: " << cuda::unavailable_reason();
    GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  }
  const Result r = run_shell(kBinary + " doctor --no-python --deep --json 2>/dev/null");
  const nlohmann::json out = nlohmann::json::parse(r.output);
  const nlohmann::json& deep = out["facts"]["deep"];
  ASSERT_GE(deep["gpus"].get<int>(), 1) << deep.dump(2);
  EXPECT_EQ(deep["burns"].size(), deep["gpus"].get<size_t>());
  for (const auto& burn : deep["burns"]) {
    EXPECT_TRUE(burn["ok"].get<bool>()) << burn.dump();
    EXPECT_GT(burn["tflops"].get<double>(), 0) << burn.dump();
  }
  for (const auto& copy : deep["copies"]) EXPECT_TRUE(copy["ok"].get<bool>()) << copy.dump();
  for (const auto& check : out["checks"]) {
    if (check["name"] == "peer-copies" && deep["gpus"] == 1) {
      EXPECT_EQ(check["status"], "info") << check.dump();
    }
    if (check["name"] == "gemm-burn") {
      EXPECT_NE(check["status"], "fail") << check.dump();
    }
  }
}

TEST(DoctorCommand, HelpSaysDeepRunsTheGpus) {
  const Result r = run("doctor --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("--deep also runs the GPUs for a few seconds"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--deep-timeout"), std::string::npos) << r.output;
}

#ifdef LOCKSTEP_NVML_STANDIN
// `lockstep doctor` reading the stand-in NVML with one profile of tests/gpu/profiles. The
// Python stack has its own tests (doctor_python_test.cpp): skipped here, it would make each
// run import this machine's torch.
Result doctor_with(const std::string& profile, const std::string& arguments = "") {
  return run_shell("env -u CUDA_VISIBLE_DEVICES -u CUDA_DEVICE_ORDER LOCKSTEP_NVML_LIBRARY=" +
                   std::string(LOCKSTEP_NVML_STANDIN) + " LOCKSTEP_NVML_PROFILE=" + LOCKSTEP_NVML_PROFILES + "/" +
                   profile + ".json " + kBinary + " doctor --no-python " + arguments);
}

// The status the report prints for the check `name` ("" when it has no line).
std::string status_of(const std::string& output, const std::string& name) {
  for (const char* status : {"PASS", "INFO", "WARN", "FAIL"}) {
    if (output.find(std::string(status) + "  " + name + " ") != std::string::npos) return status;
  }
  return "";
}

TEST(DoctorCommand, EccErrorsAndPendingRetirementFail) {
  // Profile: GPU 1 has 2 uncorrected ECC errors, a retirement pending, HW thermal slowdown;
  // persistence mode is off.
  const Result r = doctor_with("ecc-throttle");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(status_of(r.output, "ecc"), "FAIL") << r.output;
  EXPECT_EQ(status_of(r.output, "retired-pages"), "FAIL") << r.output;
  EXPECT_EQ(status_of(r.output, "throttling"), "WARN") << r.output;
  EXPECT_EQ(status_of(r.output, "persistence"), "WARN") << r.output;
  EXPECT_NE(r.output.find("uncorrected ECC errors on GPU 1"), std::string::npos) << r.output;
}

TEST(DoctorCommand, OldDriverFailsAgainstTheCudaRuntimeOfThisBuild) {
  // Profile: driver 470.199.02, which supports CUDA 11.4 at most.
  const Result r = doctor_with("old-driver", "--json");
  const nlohmann::json out = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  const std::string runtime = out["facts"]["build"]["cuda_runtime"];
  std::string status;
  for (const auto& check : out["checks"]) {
    if (check["name"] == "driver-vs-cuda-runtime") status = check["status"];
  }
  if (runtime == "none") {
    EXPECT_EQ(status, "info") << "a build without CUDA has no runtime to compare";
  } else {
    // Any CUDA 12 or 13 runtime needs a newer major than 11.4.
    EXPECT_EQ(status, "fail") << r.output;
    EXPECT_EQ(r.exit_code, 2);
  }
  EXPECT_EQ(out["facts"]["gpus"]["driver_version"], "470.199.02");
}

TEST(DoctorCommand, SharedServerNamesTheGpusOthersHoldAndTheirMemory) {
  // Profile: host PIDs (outside this PID namespace) hold 42163240960 bytes on GPU 0 and
  // 23622320128 + 8589934592 on GPU 1; this process holds 1 GiB on GPU 2.
  const Result r = doctor_with("shared-server");
  EXPECT_EQ(status_of(r.output, "other-processes"), "WARN") << r.output;
  EXPECT_NE(r.output.find("GPU 0 (39.3 GiB by pid 2814467)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GPU 1 (30 GiB by pid 2815102, pid 2815230)"), std::string::npos) << r.output;
  const size_t line = r.output.find("other-processes");
  ASSERT_NE(line, std::string::npos) << r.output;
  EXPECT_EQ(r.output.substr(line, r.output.find('\n', line) - line).find("GPU 2 ("), std::string::npos)
      << "our own process is not another user's\n"
      << r.output;
  EXPECT_NE(r.output.find("outside this container's PID namespace"), std::string::npos) << r.output;
  // GPU pairs 0-1 and 2-3 have NVLink, the others SYS: which GPUs a job gets matters.
  EXPECT_EQ(status_of(r.output, "topology"), "WARN") << r.output;
  EXPECT_GE(r.exit_code, 1);
}

TEST(DoctorCommand, DgxA100PrintsAnNv12MatrixAndPassesTopology) {
  const Result r = doctor_with("a100-8x-nvlink");
  EXPECT_EQ(status_of(r.output, "topology"), "PASS") << r.output;
  EXPECT_EQ(status_of(r.output, "gpus-seen"), "PASS") << r.output;
  for (int i = 0; i < 8; ++i) {
    // Row i: "GPUi", then NV12 for every other GPU and X on the diagonal.
    std::vector<std::string> expected = {"GPU" + std::to_string(i)};
    for (int j = 0; j < 8; ++j) expected.push_back(i == j ? "X" : "NV12");
    bool found = false;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) found |= split_words(line) == expected;
    EXPECT_TRUE(found) << "row " << i << "\n" << r.output;
  }
}

// The stand-in's HGX with a link trained down, erring NVLinks and a GPU the fabric manager
// has not registered: each is named, and the unregistered GPU fails the report.
TEST(DoctorCommand, HgxFaultsNameTheNarrowLinkTheErringNvlinksAndTheUnregisteredGpu) {
  const Result r = doctor_with("hgx-h100-faults");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("GPU 1 (x8 of x16 lanes)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GPU 2: 214 replays, 2 recoveries"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GPU 3 (in progress)"), std::string::npos) << r.output;
}

// NVML sees eight GPUs, CUDA none: the deep checks say so instead of passing.
TEST(DoctorCommand, DeepOnGpusCudaCannotUseIsSkippedNotPassed) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  const Result r = doctor_with("a100-8x-nvlink", "--deep");
  EXPECT_EQ(status_of(r.output, "peer-copies"), "INFO") << r.output;
  EXPECT_EQ(status_of(r.output, "gemm-burn"), "INFO") << r.output;
  EXPECT_NE(r.output.find("skipped: no CUDA device"), std::string::npos) << r.output;
  EXPECT_EQ(r.exit_code, doctor_with("a100-8x-nvlink").exit_code) << r.output;
}

TEST(DoctorCommand, EveryProfileGivesAReportAndJson) {
  for (const char* profile :
       {"a100-8x-nvlink", "h100-8x", "t4-4x-pcie", "shared-server", "ecc-throttle", "old-driver", "failing-call"}) {
    const Result text = doctor_with(profile);
    EXPECT_TRUE(text.exit_code >= 0 && text.exit_code <= 2) << profile << "\n" << text.output;
    EXPECT_NE(text.output.find("  nvml "), std::string::npos) << profile << "\n" << text.output;
    const Result json = doctor_with(profile, "--json 2>/dev/null");
    const nlohmann::json out = nlohmann::json::parse(json.output);
    EXPECT_EQ(out["exit_code"].get<int>(), text.exit_code) << profile;
  }
}
#endif  // LOCKSTEP_NVML_STANDIN

}  // namespace
}  // namespace lockstep
