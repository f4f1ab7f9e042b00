// `lockstep run --ramp` as a user runs it: lockstep train at 1 and 2 workers with the same
// weights, a PyTorch DDP script's own samples/s, a program that fails only at 2 workers
// (the ramp stops there, with the failure report), the --ramp-seconds clock, GPU utilization
// when the program prints no figure (the NVML stand-in), and the errors for bad requests.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "gpu/standin_env.h"
#include "tools/common/command_testing.h"
#include "tools/common/small_dataset.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using namespace command_testing;

class RunRamp : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("lockstep-ramp-" + std::to_string(getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  Result ramp(const std::string& arguments, const std::string& env = "") {
    return run_shell("env OMP_NUM_THREADS=1 " + env + " " + kBinary + " run --log-dir " + (root_ / "logs").string() +
                     " " + arguments);
  }

  fs::path root_;
};

TEST_F(RunRamp, LockstepTrainScalesWithOneDevicesWeights) {
  write_small_fashion_mnist(root_ / "data");
  const Result r = ramp("--ramp 1,2 -- " + kBinary + " train --quiet --data " + (root_ / "data").string() +
                        " --model mlp --steps 8 --batch-size 32 --micro-batch 8 --threads 1 --strategy ddp");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("workers  throughput  speed-up  efficiency  source"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1.00x        100%  summary.json samples_per_second"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n      2 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("weights: 1, 2 workers end 8 steps with the same weights_sha256"), std::string::npos)
      << r.output;
  for (const char* scale : {"workers-1", "workers-2"})
    EXPECT_TRUE(fs::exists(root_ / "logs" / scale / "out" / "summary.json")) << scale;
}

TEST_F(RunRamp, APyTorchScriptsThroughputComesFromWhatRankZeroPrints) {
  const Result r = ramp("--ramp 1,2 --ramp-metric 'samples/s=([0-9.]+)' -- /usr/bin/python3 " +
                            std::string(LOCKSTEP_SOURCE_DIR) + "/tests/tools/run/torch_ddp_throughput.py",
                        "STEPS=40");
  if (r.output.find("SKIP") != std::string::npos) GTEST_SKIP() << r.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("1.00x        100%  rank 0's output (--ramp-metric)"), std::string::npos) << r.output;
  const size_t two = r.output.find("\n      2 ");
  ASSERT_NE(two, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("x ", two), std::string::npos) << r.output;  // a speed-up, not "-"
}

TEST_F(RunRamp, TheRampStopsAtTheFirstScaleThatFails) {
  const Result r = ramp(
      "--ramp 1,2,4 --ramp-metric 'n=([0-9]+)' -- sh -c 'echo n=$WORLD_SIZE; "
      "if [ $WORLD_SIZE = 2 ] && [ $RANK = 1 ]; then echo too many >&2; exit 3; fi'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("lockstep run: rank 1 failed first (exit code 3)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the ramp stopped at 2 workers, which failed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("      2         2.0     2.00x        100%  failed"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("ramp: 4 workers"), std::string::npos) << r.output;
}

TEST_F(RunRamp, EachScaleEndsAfterRampSeconds) {
  const Result r = ramp(
      "--ramp 1,2 --ramp-seconds 1 --ramp-metric 'rate=([0-9]+)' -- sh -c "
      "'while :; do echo rate=$((WORLD_SIZE * 30)); sleep 0.1; done'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("      2        60.0     2.00x        100%  rank 0's output (--ramp-metric), stopped after "
                          "--ramp-seconds"),
            std::string::npos)
      << r.output;
}

TEST_F(RunRamp, WithoutAFigureTheRampSaysSo) {
  const Result r = ramp("--ramp 1,2 -- true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("      1           -         -           -  no figure: give --ramp-metric"),
            std::string::npos)
      << r.output;
}

#if defined(LOCKSTEP_NVML_STANDIN)
// On GPUs a program that prints nothing is measured by its GPUs' utilization.
TEST_F(RunRamp, WithoutAMetricGpuUtilizationIsTheFigure) {
  const Result r = ramp("--ramp 1,2 --ramp-seconds 2 -- sleep 30",
                        "LOCKSTEP_NVML_LIBRARY=" + std::string(LOCKSTEP_NVML_STANDIN) +
                            " LOCKSTEP_NVML_PROFILE=" + testing::standin_profile_path("t4-4x-busy.json") +
                            " LOCKSTEP_GPU_LEASE_DIR=" + (root_ / "leases").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 on GPU 1 (Tesla T4"), std::string::npos) << r.output;
  // Every reading is 88 to 96 percent: 1 GPU is 88-96, 2 GPUs 176-192.
  const size_t one = r.output.find("\n      1  ");
  const size_t two = r.output.find("\n      2  ");
  ASSERT_NE(one, std::string::npos) << r.output;
  ASSERT_NE(two, std::string::npos) << r.output;
  const double first = std::stod(r.output.substr(one + 9, 10)), second = std::stod(r.output.substr(two + 9, 10));
  EXPECT_GE(first, 88);
  EXPECT_LE(first, 96);
  EXPECT_GE(second, 176);
  EXPECT_LE(second, 192);
  EXPECT_NE(r.output.find("GPU utilization: mean percent x GPUs (no --ramp-metric)"), std::string::npos) << r.output;
}

// --gpus with a ramp: each scale runs on the first GPUs of the list, in its order.
TEST_F(RunRamp, EachScaleRunsOnTheFirstGpusListed) {
  const Result r = ramp("--ramp 1,2 --gpus 3,1 --ramp-seconds 1 -- sleep 30",
                        "LOCKSTEP_NVML_LIBRARY=" + std::string(LOCKSTEP_NVML_STANDIN) +
                            " LOCKSTEP_NVML_PROFILE=" + testing::standin_profile_path("t4-4x-pcie.json") +
                            " LOCKSTEP_GPU_LEASE_DIR=" + (root_ / "leases").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t second_scale = r.output.find("ramp: 2 workers");
  ASSERT_NE(second_scale, std::string::npos) << r.output;
  const std::string first = r.output.substr(0, second_scale), second = r.output.substr(second_scale);
  EXPECT_NE(first.find("rank 0 on GPU 3 "), std::string::npos) << r.output;
  EXPECT_EQ(first.find("rank 1 on"), std::string::npos) << r.output;
  EXPECT_NE(second.find("rank 0 on GPU 3 "), std::string::npos) << r.output;
  EXPECT_NE(second.find("rank 1 on GPU 1 "), std::string::npos) << r.output;
}
#endif

TEST_F(RunRamp, BadRequestsAreRefusedSayingWhy) {
  const auto refused = [&](const std::string& arguments, const std::string& why) {
    const Result r = ramp(arguments + " -- true");
    EXPECT_NE(r.exit_code, 0) << arguments;
    EXPECT_NE(r.output.find(why), std::string::npos) << arguments << "\n" << r.output;
  };
  refused("--ramp 2,1", "--ramp takes rising worker counts, like 1,2,4; got '2,1'");
  refused("--ramp 1,2 -n 2", "--ramp 1,2 gives the worker counts: leave -n out");
  refused("--ramp 1,2 --ramp-metric 'samples/s=[0-9]+'", "needs one group around the number");
  refused("--ramp-seconds 5", "--ramp-seconds and --ramp-metric go with --ramp COUNTS");
  refused("--ramp 1,2 --ramp-seconds -1", "--ramp-seconds must be 0");
  refused("--ramp 1,2,4 --gpus 0,1", "--gpus 0,1 names 2 GPUs for a ramp up to 4 workers");
}

}  // namespace
}  // namespace lockstep
