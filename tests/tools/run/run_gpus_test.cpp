// `lockstep run --gpus` against the NVML stand-in: which GPUs the workers get, in what
// order, what the launcher says, and when it waits or refuses.
#if defined(LOCKSTEP_NVML_STANDIN)
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "gpu/standin_env.h"
#include "lockstep/gpu/gpu_leases.h"
#include "tools/common/command_testing.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using namespace command_testing;

class RunGpus : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("lockstep-run-gpus-" + std::to_string(getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // `lockstep run ARGUMENTS -- sh -c 'echo visible=$CUDA_VISIBLE_DEVICES'` on `profile`,
  // with this test's own lease directory.
  std::string launch_line(const std::string& profile, const std::string& arguments, const std::string& env = "",
                          const std::string& then = "") const {
    return "env LOCKSTEP_NVML_LIBRARY=" + std::string(LOCKSTEP_NVML_STANDIN) +
           " LOCKSTEP_NVML_PROFILE=" + testing::standin_profile_path(profile) +
           " LOCKSTEP_GPU_LEASE_DIR=" + (root_ / "leases").string() + " " + env + " " + kBinary + " run " + arguments +
           " -- sh -c 'echo visible=$CUDA_VISIBLE_DEVICES" + then + "'";
  }
  Result launch(const std::string& profile, const std::string& arguments, const std::string& env = "") {
    return run_shell(launch_line(profile, "--log-dir " + (root_ / "logs").string() + " " + arguments, env));
  }
  // The UUID of NVML GPU `index` in a profile, read from the file itself.
  static std::string uuid(const std::string& profile, int index) {
    std::ifstream in(testing::standin_profile_path(profile));
    return nlohmann::json::parse(in)["devices"][index]["uuid"];
  }

  fs::path root_;
};

// shared-server: other users hold GPUs 0 and 1, this process (the launcher) GPU 2.
TEST_F(RunGpus, AutoGivesEveryWorkerTheFreeGpusInRankOrder) {
  const Result r = launch("shared-server.json", "-n 2 --gpus auto");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string visible = "visible=" + uuid("shared-server.json", 2) + "," + uuid("shared-server.json", 3);
  EXPECT_NE(r.output.find("[rank 0] " + visible), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] " + visible), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0 on GPU 2 (NVIDIA RTX A6000, "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 on GPU 3 (NVIDIA RTX A6000, "), std::string::npos) << r.output;
  // Without --gpus the same choice is the default when there is a GPU per worker.
  const Result plain = launch("shared-server.json", "-n 2");
  EXPECT_NE(plain.output.find("[rank 1] " + visible), std::string::npos) << plain.output;
}

TEST_F(RunGpus, AListIsTakenAsGivenAndSetsTheWorkerCount) {
  const Result r = launch("shared-server.json", "--gpus 3,0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 1] visible=" + uuid("shared-server.json", 3) + "," + uuid("shared-server.json", 0)),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank 1 on GPU 0"), std::string::npos) << r.output;
}

TEST_F(RunGpus, TooFewFreeGpusFailsAfterTheWaitNamingWhoHoldsThem) {
  const Result r = launch("shared-server.json", "-n 3 --gpus auto --wait 0");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("2 of 3 GPUs are free"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GPU 0 is held by pid 2814467 (outside this PID namespace"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("visible="), std::string::npos) << "no worker may start\n" << r.output;

  const Result memory = launch("shared-server.json", "-n 2 --gpus auto --min-free-memory 47.5G --wait 0");
  EXPECT_EQ(memory.exit_code, 1) << memory.output;
  EXPECT_NE(memory.output.find("GPU 2 has 46.6 GiB free, under the 47.5 GiB asked"), std::string::npos)
      << memory.output;
  EXPECT_EQ(launch("shared-server.json", "-n 1 --gpus auto --min-free-memory 47.5G --wait 0").exit_code, 0);
}

TEST_F(RunGpus, WaitsUntilAGpuFrees) {
  // One GPU whose memory is taken at the first reading and free at the next.
  const fs::path profile = root_ / "busy-then-free.json";
  std::ofstream(profile) << R"({"driver_version": "550.54.15", "cuda_driver_version": 12040,
    "devices": [{"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-5f1c0d2e-0000-4000-8000-000000000001",
                 "pci_bus_id": "00000000:18:00.0", "compute_capability": "9.0",
                 "memory": {"total": 85520809984, "reserved": 0, "used": [85000000000, 1000000]}}]})";
  const Result r = launch(profile.string(), "-n 1 --gpus auto --min-free-memory 10G");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("waiting for GPUs: 0 of 1 GPUs are free; GPU 0 has 0.5 GiB free"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("visible=GPU-5f1c0d2e-0000-4000-8000-000000000001"), std::string::npos) << r.output;
}

TEST_F(RunGpus, StaysWithinTheLaunchersVisibleDevices) {
  const Result r = launch("shared-server.json", "-n 1 --gpus auto", "CUDA_VISIBLE_DEVICES=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("visible=" + uuid("shared-server.json", 2)), std::string::npos) << r.output;
  const Result two = launch("shared-server.json", "-n 2 --gpus auto", "CUDA_VISIBLE_DEVICES=2");
  EXPECT_EQ(two.exit_code, 2) << two.output;
  EXPECT_NE(two.output.find("there are 1 visible through CUDA_VISIBLE_DEVICES"), std::string::npos) << two.output;
  // Without --gpus the launcher's own choice is left alone, as torchrun leaves it.
  const Result kept = launch("shared-server.json", "-n 2", "CUDA_VISIBLE_DEVICES=2");
  EXPECT_NE(kept.output.find("[rank 1] visible=2"), std::string::npos) << kept.output;
}

// Two launches started together on a 4-GPU host get disjoint GPUs: each leases what it
// picks, and the later one picks again around the other's leases.
TEST_F(RunGpus, TwoLaunchesAtOnceGetDisjointGpus) {
  const std::string first = (root_ / "first.out").string(), second = (root_ / "second.out").string();
  const auto job = [&](const std::string& name) {
    return launch_line("t4-4x-pcie.json", "-n 2 --gpus auto --log-dir " + (root_ / name).string(), "", "; sleep 1");
  };
  const Result both =
      run_shell("(" + job("a") + " > " + first + " 2>&1 &); " + job("b") + " > " + second + " 2>&1; wait; sleep 1.5");
  std::set<std::string> gpus;
  for (const std::string& out : {first, second}) {
    std::ifstream in(out);
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    const size_t at = text.find("[rank 0] visible=");
    ASSERT_NE(at, std::string::npos) << text;
    std::stringstream list(text.substr(at + 17, text.find('\n', at) - at - 17));
    for (std::string uuid; std::getline(list, uuid, ',');) gpus.insert(uuid);
  }
  EXPECT_EQ(gpus.size(), 4u) << "the two jobs shared a GPU";
}

// A lease held by a live process makes its GPU busy, naming the holder; one whose holder
// is gone (the file is left, unlocked) is taken over.
TEST_F(RunGpus, ALeasedGpuIsBusyAndAnAbandonedLeaseIsTakenOver) {
  gpu::GpuLeases held((root_ / "leases").string());
  ASSERT_TRUE(held.take_all({uuid("t4-4x-pcie.json", 0)}, "pid 4242 (user ana): lockstep run -n 1 -- train.py"));
  const Result all = launch("t4-4x-pcie.json", "-n 4 --gpus auto --wait 0");
  EXPECT_EQ(all.exit_code, 1) << all.output;
  EXPECT_NE(all.output.find("GPU 0 is leased by pid 4242 (user ana): lockstep run -n 1 -- train.py"), std::string::npos)
      << all.output;
  const Result rest = launch("t4-4x-pcie.json", "-n 3 --gpus auto");
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  EXPECT_EQ(rest.output.find("visible=" + uuid("t4-4x-pcie.json", 0)), std::string::npos) << rest.output;
  held.release_all();  // as when its holder exits: the file stays, the lock goes
  const Result taken = launch("t4-4x-pcie.json", "-n 4 --gpus auto --wait 0");
  EXPECT_EQ(taken.exit_code, 0) << taken.output;
}

TEST_F(RunGpus, AnUnknownGpuIsAnErrorThatListsTheGpus) {
  const Result r = launch("shared-server.json", "--gpus 9");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("there is no GPU 9 on this host (the GPUs are 0,1,2,3"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace lockstep
#endif
