// Past one host: jobs started by mpirun on two test hosts (scripts/test-hosts: network
// namespaces joined by a shaped bridge), their ranks talking over TCP as on a cluster.
// `lockstep train` gives one device's weights across hosts under ddp, zero1 and the GPT
// mesh, and a rank killed on one host ends the job on both, named.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "lockstep/comm/flight_recorder.h"
#include "lockstep/core/error.h"
#include "tools/common/command_testing.h"
#include "tools/common/test_hosts.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using namespace command_testing;

class MultiHost : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = TestHosts::unavailable(); !why.empty()) GTEST_SKIP() << why;
    if (!on_path("mpirun")) GTEST_SKIP() << "mpirun is not on PATH (install openmpi-bin)";
    root_ = fs::temp_directory_path() / ("lockstep-multi-host-" + std::to_string(getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    hosts_ = std::make_unique<TestHosts>(2, "--rate 1gbit");
    ASSERT_TRUE(hosts_->ok()) << hosts_->error();
  }
  void TearDown() override {
    hosts_.reset();
    fs::remove_all(root_);
  }

  std::string sha(const std::string& run) const {
    std::ifstream in(root_ / run / "summary.json");
    return nlohmann::json::parse(in).value("weights_sha256", "");
  }

  fs::path root_;
  std::unique_ptr<TestHosts> hosts_;
};

TEST_F(MultiHost, DdpAndZeroOneAcrossTwoHostsGiveOneDevicesBits) {
  const std::string flags = "train --quiet --model mlp --steps 4 --batch-size 32 --micro-batch 8 --threads 1";
  ASSERT_EQ(run(flags + " --devices 1 --out " + (root_ / "one").string()).exit_code, 0);
  for (const std::string strategy : {"ddp", "zero1"}) {
    const Result r = run_shell(hosts_->mpirun(2, 2) + kBinary + " " + flags + " --strategy " + strategy +
                               " --backend mpi --out " + (root_ / strategy).string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(sha(strategy), sha("one")) << strategy << " on 2 hosts x 2 ranks";
  }
}

TEST_F(MultiHost, TheGptMeshAcrossHostsKeepsItsBits) {
  const std::string flags =
      "train --quiet --model gpt --preset tiny --steps 3 --batch-size 8 --micro-batch 2 --threads 1";
  ASSERT_EQ(run(flags + " --devices 1 --out " + (root_ / "one").string()).exit_code, 0);
  // Data parallel across the hosts, the pipeline's two stages within each.
  const Result r = run_shell(hosts_->mpirun(2, 2) + kBinary + " " + flags +
                             " --strategy mesh --dp 2 --pp 2 --backend mpi --out " + (root_ / "mesh").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(sha("mesh"), sha("one"));
}

// A rank SIGKILLed on the second host: the job ends on both hosts, and mpirun names it.
TEST_F(MultiHost, ARankKilledOnOneHostEndsTheJobOnBoth) {
  const fs::path flight = root_ / "flight";
  auto job = std::async(std::launch::async, [&] {
    return run_shell("env LOCKSTEP_FLIGHT_DIR=" + flight.string() + " " +
                     hosts_->mpirun(2, 2, "LOCKSTEP_FLIGHT_DIR") + kBinary +
                     " train --quiet --model mlp --steps 100000 --batch-size 32 --micro-batch 8 --threads 1 "
                     "--strategy ddp --backend mpi --out " +
                     (root_ / "killed").string());
  });
  // Rank 3 (the second host's second rank) says in its flight record when it trains, and
  // its pid.
  pid_t rank3 = 0;
  for (int i = 0; i < 600 && rank3 == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream in(flight / "rank3.flight.json");
    if (!in) continue;
    try {
      const comm::FlightReport report =
          comm::parse_flight_report({std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()});
      if (report.activity.step >= 3) rank3 = static_cast<pid_t>(report.pid);
    } catch (const Error&) {
    }
  }
  ASSERT_GT(rank3, 0) << "rank 3 never reached step 3";
  const auto killed = std::chrono::steady_clock::now();
  kill(rank3, SIGKILL);
  const Result r = job.get();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(seconds, 60) << "the job outlived its killed rank:\n" << r.output;
  EXPECT_NE(r.output.find("rank 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace lockstep
