// `lockstep run` as a user runs it: torchrun's environment for every worker, output by
// rank, a failure that stops the group and says which rank, signals that reach the
// workers, restarts, and real clients (Lockstep's ddp training and a PyTorch DDP script).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "lockstep/core/device.h"
#include "tools/common/command_testing.h"
#include "tools/common/small_dataset.h"
#include "tools/run/lost_peer.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using namespace command_testing;

class RunCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("lockstep-run-test-" + std::to_string(getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // `lockstep run` with its logs under root_, after `env` assignments.
  Result launch(const std::string& arguments, const std::string& env = "") {
    return run_shell((env.empty() ? "" : "env " + env + " ") + kBinary + " run --log-dir " + (root_ / "logs").string() +
                     " " + arguments);
  }
  std::string read(const fs::path& path) const {
    std::ifstream in(path);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  // Whether the pid written to `file` (by a worker) is still a live process.
  bool alive(const fs::path& file) const {
    const std::string text = read(file);
    if (text.empty()) return false;
    return kill(std::stoi(text), 0) == 0;
  }

  fs::path root_;
};

TEST_F(RunCommand, GivesEveryWorkerTorchrunsEnvironmentAndPrefixesItsOutput) {
  const Result r = launch(
      "-n 2 -- sh -c 'echo env $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR "
      "port=$MASTER_PORT omp=$OMP_NUM_THREADS; echo to-stderr >&2'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] env 0 0 2 2 0 127.0.0.1 port="), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] env 1 1 2 2 0 127.0.0.1 port="), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] to-stderr"), std::string::npos) << r.output;
  const std::string threads = "omp=" + std::to_string(std::max(1, host_cores() / 2));
  EXPECT_NE(r.output.find(threads), std::string::npos) << r.output;
  // Both ranks were given the same, real port.
  const size_t at = r.output.find("port=");
  const std::string port = r.output.substr(at, r.output.find(' ', at) - at);
  EXPECT_NE(port, "port=");
  EXPECT_NE(r.output.find(port, at + 1), std::string::npos) << r.output;
  EXPECT_NE(read(root_ / "logs" / "rank1.log").find("to-stderr"), std::string::npos);
}

TEST_F(RunCommand, AFailedWorkerStopsTheOthersAndIsNamed) {
  const auto start = std::chrono::steady_clock::now();
  const Result r = launch("-n 3 --grace 2 -- sh -c 'echo $$ > " + root_.string() +
                          "/pid-$RANK; if [ $RANK = 1 ]; then echo giving up; exit 3; fi; exec sleep 60'");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_LT(seconds, 30) << "the other workers were not stopped";
  EXPECT_NE(r.output.find("rank 1 failed first (exit code 3)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("    giving up"), std::string::npos) << r.output;  // its last lines
  EXPECT_NE(r.output.find((root_ / "logs" / "rank1.log").string()), std::string::npos) << r.output;
  for (int rank : {0, 2}) EXPECT_FALSE(alive(root_ / ("pid-" + std::to_string(rank)))) << "rank " << rank;
}

// SIGTERM to the launcher reaches every worker; SIGKILL to it takes them down with it, and

// Rank 1 raises; rank 0, whose gloo connection to it closes, exits first. The launcher
// names rank 1 from the error files torchrun's @record leaves: rank 0's says it lost a peer.
TEST_F(RunCommand, ARankThatLostItsPeerIsNotBlamed) {
  const std::string raised = (root_ / "raised").string();
  auto error_json = [](const std::string& message) {
    return "echo \"{\\\"message\\\": {\\\"message\\\": \\\"" + message + "\\\"}}\" > $TORCHELASTIC_ERROR_FILE";
  };
  const Result r = launch(
      "-n 2 --grace 2 -- sh -c '"
      "if [ $RANK = 1 ]; then " +
      error_json("ValueError: rank 1 gives up") + "; touch " + raised +
      "; sleep 0.2; exit 1; fi; "
      "while [ ! -e " +
      raised + " ]; do sleep 0.02; done; " +
      error_json("RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                 "[127.0.0.1]:40123") +
      "; exit 1'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("rank 1 failed (exit code 1), and rank 0's failure followed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("its error: ValueError: rank 1 gives up"), std::string::npos) << r.output;
}

TEST(LostPeer, TheCommunicationLibrariesErrorsForAPeerThatWentAway) {
  for (const char* error : {"RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
                            "peer [10.0.0.2]:21354",
                            "RuntimeError: [gloo/transport/tcp/pair.cc:598] Connection reset by peer",
                            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote "
                            "process exited or there was a network error, NCCL version 2.21.5",
                            "DistNetworkError: Broken pipe"}) {
    EXPECT_TRUE(tools::reports_a_lost_peer(error)) << error;
  }
  for (const char* error : {"ValueError: rank 3 gives up", "RuntimeError: CUDA out of memory", ""}) {
    EXPECT_FALSE(tools::reports_a_lost_peer(error)) << error;
  }
}
// what they started too (a shell's child in the background).
TEST_F(RunCommand, NoWorkerOutlivesTheLauncher) {
  for (const int signal : {SIGTERM, SIGKILL}) {
    const fs::path pids = root_ / ("pids-" + std::to_string(signal));
    fs::create_directories(pids);
    const pid_t launcher = fork();
    ASSERT_GE(launcher, 0);
    if (launcher == 0) {
      const std::string script =
          "sleep 60 & echo $! > " + pids.string() + "/child-$RANK; echo $$ > " + pids.string() + "/$RANK; wait";
      const std::string logs = (root_ / "logs").string();
      execl(kBinary.c_str(), kBinary.c_str(), "run", "-n", "2", "--log-dir", logs.c_str(), "--", "sh", "-c",
            script.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    const std::vector<fs::path> all = {pids / "0", pids / "1", pids / "child-0", pids / "child-1"};
    const auto every = [&](auto predicate) { return std::all_of(all.begin(), all.end(), predicate); };
    for (int i = 0; i < 200 && !every([](const fs::path& p) { return fs::exists(p) && fs::file_size(p) > 0; }); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_TRUE(every([&](const fs::path& p) { return alive(p); })) << "the workers did not start";
    kill(launcher, signal);
    int status = 0;
    waitpid(launcher, &status, 0);
    bool gone = false;
    for (int i = 0; i < 250 && !gone; ++i) {
      gone = every([&](const fs::path& p) { return !alive(p); });
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(gone) << "a worker or its child outlived a launcher ended by signal " << signal;
  }
}

// A worker that ended leaves nothing behind when the job ends: what it started in the
// background goes with the group.
TEST_F(RunCommand, WhatAnEndedWorkerStartedEndsWithTheJob) {
  const fs::path child = root_ / "child";
  const Result r = launch("-n 2 -- sh -c 'if [ $RANK = 0 ]; then sleep 60 & echo $! > " + child.string() +
                          "; exit 0; fi; while [ ! -s " + child.string() + " ]; do sleep 0.01; done; exit 3'");
  EXPECT_EQ(r.exit_code, 3) << r.output;  // rank 1's
  bool gone = false;
  for (int i = 0; i < 250 && !gone; ++i) {
    gone = !alive(child);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(gone) << "rank 0's background child outlived the job";
}

// Output that never ends a line reaches the terminal in pieces, not held whole by the launcher.
TEST_F(RunCommand, OutputWithoutNewlinesIsRelayedInPieces) {
  const Result r = launch("-n 1 -- sh -c \"head -c 200000 /dev/zero | tr '\\\\0' x\"");
  ASSERT_EQ(r.exit_code, 0) << r.output.substr(0, 400);
  size_t pieces = 0, longest = 0;
  for (size_t at = r.output.find("[rank 0] x"); at != std::string::npos; at = r.output.find("[rank 0] x", at + 1)) {
    ++pieces;
    longest = std::max(longest, r.output.find('\n', at) - at - std::strlen("[rank 0] "));
  }
  EXPECT_EQ(pieces, 4u);  // 3 x 64 KiB and the rest
  EXPECT_EQ(longest, 65536u);
  EXPECT_EQ(fs::file_size(root_ / "logs" / "rank0.log"), 200000u);  // the log keeps the bytes as they came
}

TEST_F(RunCommand, RestartsTheGroupAfterAFailure) {
  const std::string marker = (root_ / "failed-once").string();
  const Result r = launch("-n 2 --max-restarts 1 -- sh -c 'if [ $RANK = 0 ] && [ ! -e " + marker + " ]; then touch " +
                          marker + "; exit 5; fi; echo attempt $TORCHELASTIC_RESTART_COUNT done'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("restarting the group (1 of 1)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 0] attempt 1 done"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(root_ / "logs" / "rank0.log"));  // the failed attempt's, kept
  EXPECT_NE(read(root_ / "logs" / "rank0.restart1.log").find("attempt 1 done"), std::string::npos);
}

TEST_F(RunCommand, BadInputGetsOneLineAndExitCodeTwo) {
  for (const std::string& arguments :
       {std::string("-n 0 -- true"), std::string("-n 2147483648 -- true"), std::string("-n 2"),
        std::string("-n 2 -- no-such-program-here"), std::string("--bogus 1 -- true"),
        std::string("-n 2 -- /no/such/file"), std::string("-n 1 --min-free-memory 10X -- true"),
        std::string("--gpus 1,x -- true"), std::string("-n 1 --master-port 70000 -- true"),
        std::string("-n 1 --gpus 0 -- true"),
        std::string("-n 1 --nnodes 2 --node-rank 2 --master-addr 10.0.0.1 -- true"),
        std::string("-n 1 --nnodes 2 --node-rank 1 -- true"), std::string("-n 1 --nnodes 0 -- true"),
        std::string("-n 1 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --join-timeout 0 -- true")}) {
    // No NVML (whatever this host has), so --gpus 0 names a GPU that is not there.
    const Result r = launch(arguments, kNoNvml);
    EXPECT_EQ(r.exit_code, 2) << arguments << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << arguments << "\n" << r.output;
  }
}

// A --master-port someone listens on is refused before any worker starts.
TEST_F(RunCommand, RefusesAMasterPortInUse) {
  BusyPort busy;
  const int port = busy.port();
  ASSERT_GT(port, 0);
  const Result r = launch("-n 1 --master-port " + std::to_string(port) + " -- echo started");
  busy.close();
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--master-port " + std::to_string(port) + " is not free"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("started"), std::string::npos) << r.output;
  // Free again: the same port is used as given.
  const Result ok = launch("-n 1 --master-port " + std::to_string(port) + " -- sh -c 'echo port=$MASTER_PORT'");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("port=" + std::to_string(port)), std::string::npos) << ok.output;
}

// Lockstep's own ddp training under `lockstep run`: one device's weights, bit for bit.
TEST_F(RunCommand, RunsLockstepDdpTraining) {
  write_small_fashion_mnist(root_ / "data");
  const std::string flags = "train --quiet --data " + (root_ / "data").string() +
                            " --model mlp --steps 4 --batch-size 32 --micro-batch 8 --threads 1";
  ASSERT_EQ(run(flags + " --devices 1 --out " + (root_ / "one").string()).exit_code, 0);
  const Result r = launch("-n 2 -- " + kBinary + " " + flags + " --strategy ddp --out " + (root_ / "ddp").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto sha = [&](const fs::path& dir) { return nlohmann::json::parse(read(dir / "summary.json"))["weights_sha256"]; };
  EXPECT_EQ(sha(root_ / "ddp"), sha(root_ / "one"));
}

// A PyTorch DDP script (gloo, env:// rendezvous) under `lockstep run`: its ranks agree.
TEST_F(RunCommand, RunsAPyTorchDdpScript) {
  const std::string script = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/tools/run/torch_ddp_env.py";
  const Result r = launch("-n 2 -- /usr/bin/python3 " + script);
  if (r.output.find("SKIP") != std::string::npos) GTEST_SKIP() << r.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t zero = r.output.find("[rank 0] weights ");
  const size_t one = r.output.find("[rank 1] weights ");
  ASSERT_NE(zero, std::string::npos) << r.output;
  ASSERT_NE(one, std::string::npos) << r.output;
  const auto value = [&](size_t at) {
    const size_t begin = r.output.find("weights ", at);
    return r.output.substr(begin, r.output.find('\n', begin) - begin);
  };
  EXPECT_EQ(value(zero), value(one));
}

// Under mpirun the ranks exist already: `lockstep run` maps their variables and runs the
// command in place.
TEST_F(RunCommand, UnderMpirunMapsItsVariables) {
  if (!on_path("mpirun")) GTEST_SKIP() << "mpirun is not on PATH (install openmpi-bin)";
  const Result r =
      run_mpi(2, "run -- sh -c 'echo mapped $RANK of $WORLD_SIZE local $LOCAL_RANK at $MASTER_ADDR:$MASTER_PORT'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("mapped 0 of 2 local 0 at 127.0.0.1:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mapped 1 of 2 local 1 at 127.0.0.1:"), std::string::npos) << r.output;
  // One port for both ranks, from the job id.
  const size_t first = r.output.find("127.0.0.1:"), second = r.output.find("127.0.0.1:", first + 1);
  ASSERT_NE(second, std::string::npos);
  EXPECT_EQ(r.output.substr(first, 15), r.output.substr(second, 15)) << r.output;
}

// Under srun (its variables, as a step of 4 tasks on 2 nodes gives them): rank 0's host is
// the step's first node, and the port comes from the job and step ids.
TEST_F(RunCommand, UnderSrunMasterAddrIsTheStepsFirstNode) {
  const std::string slurm =
      "SLURM_PROCID=3 SLURM_NTASKS=4 SLURM_LOCALID=1 SLURM_NODEID=1 SLURM_TASKS_PER_NODE='2(x2)' SLURM_JOB_ID=4242 "
      "SLURM_STEP_ID=0 SLURM_STEP_NODELIST='gpu[07-08]' SLURM_JOB_NODELIST='gpu[07-08]'";
  const Result r = run_shell("env " + slurm + " " + kBinary + " run -- sh -c 'echo $RANK $LOCAL_RANK $WORLD_SIZE at " +
                             "$MASTER_ADDR:$MASTER_PORT'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("3 1 4 at gpu07:", 0), 0u) << r.output;
  const Result again = run_shell("env " + slurm + " " + kBinary + " run -- sh -c 'echo $MASTER_PORT'");
  EXPECT_NE(r.output.find(":" + again.output.substr(0, again.output.size() - 1)), std::string::npos)
      << r.output << again.output;
  const Result given = run_shell("env " + slurm + " MASTER_ADDR=10.1.2.3 MASTER_PORT=31000 " + kBinary +
                                 " run -- sh -c 'echo $MASTER_ADDR:$MASTER_PORT'");
  EXPECT_EQ(given.output, "10.1.2.3:31000\n");
  const Result port =
      run_shell("env " + slurm + " " + kBinary + " run --master-port 31001 -- sh -c 'echo $MASTER_PORT'");
  EXPECT_EQ(port.output, "31001\n");
}

}  // namespace
}  // namespace lockstep
