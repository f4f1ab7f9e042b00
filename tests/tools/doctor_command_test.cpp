// `lockstep doctor` as a user runs it: without a driver (an NVML library that does not
// exist) it reports the CPU devices and does not fail; --json parses; bad flags are usage
// errors. With the stand-in NVML library (tests/gpu/), each profile gets the statuses the
// rules give it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "lockstep/core/device.h"
#include "tools/command_testing.h"

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

}  // namespace
}  // namespace lockstep
