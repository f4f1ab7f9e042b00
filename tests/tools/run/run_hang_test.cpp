// `lockstep run` names the rank that holds a job back: a rank that stops coming to the
// collectives (--hang-timeout), a rank killed mid-step, and a `lockstep train` rank frozen
// with SIGSTOP. The workers are real processes: this test binary as Lockstep ranks, and
// the lockstep command itself.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "lockstep/comm/flight_recorder.h"
#include "lockstep/comm/init.h"
#include "tools/common/command_testing.h"
#include "tools/common/flight_testing.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using namespace command_testing;

const char* worker_mode() { return std::getenv("LOCKSTEP_TEST_WORKER"); }

// Three steps in lockstep, then step 4's backward, where rank 1 stays (or dies) while the
// others go on to the step's all-reduce.
TEST(RunHangWorker, RankOneStopsComingInBackward) {
  if (worker_mode() == nullptr || std::strncmp(worker_mode(), "run-", 4) != 0) {
    GTEST_SKIP() << "runs only as a rank launched by RunHang tests";
  }
  std::shared_ptr<comm::Communicator> world = comm::init_process_group("shm");
  comm::FlightRecorder& flight = comm::FlightRecorder::process();
  Tensor x = Tensor::full({4}, 1.0, DType::f32);
  for (int step = 1; step <= 3; ++step) {
    flight.set_step(step);
    world->all_reduce(x);
  }
  flight.set_step(4);
  if (std::strcmp(worker_mode(), "run-give-up") == 0 && world->rank() == 0) {
    // A failure of rank 0's own outside the collectives, whose peers learn of it at once
    // and exit before rank 0 has.
    const comm::FlightPhase saving("checkpoint");
    world->abort("rank 0: cannot write checkpoint-4.safetensors: No space left on device");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::fprintf(stderr, "rank 0: cannot write checkpoint-4.safetensors: No space left on device\n");
    std::exit(1);
  }
  flight.set_micro_batch(1);
  const comm::FlightPhase phase("backward");
  if (world->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));  // its record says where it is
    if (std::strcmp(worker_mode(), "run-kill") == 0) raise(SIGKILL);
    std::this_thread::sleep_for(std::chrono::seconds(120));
  }
  world->all_reduce(x);
}

class RunHang : public ::testing::Test {
 protected:
  void SetUp() override {
    logs_ = fs::temp_directory_path() / ("lockstep-run-hang-" + std::to_string(getpid()));
    fs::remove_all(logs_);
  }
  void TearDown() override { fs::remove_all(logs_); }

  // `lockstep run -n 3 <options> -- <this binary as RunHangWorker ranks in `mode`>`.
  Result launch_workers(const std::string& options, const std::string& mode) {
    const std::string self = fs::read_symlink("/proc/self/exe");
    return run_shell("env LOCKSTEP_TEST_WORKER=" + mode + " LOCKSTEP_COMM_TIMEOUT=120 " + kBinary +
                     " run -n 3 --grace 1 --log-dir " + logs_.string() + " " + options + " -- " + self +
                     " --gtest_filter=RunHangWorker.RankOneStopsComingInBackward");
  }

  fs::path logs_;
};

TEST_F(RunHang, ARankThatStopsComingIsNamedAfterTheHangTimeout) {
  const auto start = std::chrono::steady_clock::now();
  const Result r = launch_workers("--hang-timeout 2", "run-hang");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 124) << r.output;
  EXPECT_LT(seconds, 60) << "the hang was not noticed";
  EXPECT_NE(r.output.find("no rank has made progress for 2 s (--hang-timeout)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("where: rank 1 holds the others back: it is in backward of step 4, micro-batch 1, for "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("; ranks 0, 2 wait in all_reduce #4 on world (4 f32, sum) for "), std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(logs_ / "flight" / "rank1.flight.json"));
}

TEST_F(RunHang, AKilledRankIsNamedWithWhereItWas) {
  const Result r = launch_workers("", "run-kill");
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
  // Rank 1 is blamed whether its death reached the launcher first or the others' failure
  // in the all-reduce it broke did ("rank 1 failed (...), and rank 0's failure followed").
  EXPECT_TRUE(r.output.find("rank 1 failed first (killed by signal 9") != std::string::npos ||
              r.output.find("rank 1 failed (killed by signal 9 (Killed)), and rank ") != std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("where: rank 1 failed (killed by signal 9 (Killed)) in backward of step 4, micro-batch 1; "
                          "ranks 0, 2 wait"),  // still, or until their all_reduce failed with rank 1's death
            std::string::npos)
      << r.output;
}

// The rank whose own failure made the others fail is named, though they ended first.
TEST_F(RunHang, TheRankThatGaveUpIsNamedNotThePeersThatFollowed) {
  const Result r = launch_workers("", "run-give-up");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("lockstep run: rank 0 failed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("where: rank 0 failed (exit code 1) in checkpoint of step 4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
}

// Lockstep's own ddp training with rank 1 frozen by SIGSTOP mid-run: the launcher sees no
// progress, says rank 1's record stopped, where it was, and what rank 0 waits in.
TEST_F(RunHang, AFrozenLockstepTrainRankIsNamed) {
  const std::string dataset = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dataset + "/train-images-idx3-ubyte.gz")) GTEST_SKIP() << "Fashion-MNIST is not installed";
  auto launcher = std::async(std::launch::async, [&] {
    return run_shell("env CUDA_VISIBLE_DEVICES= LOCKSTEP_COMM_TIMEOUT=120 " + kBinary + " run -n 2 --grace 1 " +
                     "--hang-timeout 4 --log-dir " + logs_.string() + " -- " + kBinary +
                     " train --quiet --model mlp --steps 100000 --batch-size 32 --micro-batch 8 --threads 1 "
                     "--strategy ddp --out " +
                     (logs_ / "out").string());
  });
  // Rank 1's own record says when it is well into training, and its pid.
  const pid_t rank1 = wait_for_step(logs_ / "flight" / "rank1.flight.json", 5);
  ASSERT_GT(rank1, 0) << "rank 1 never reached step 5";
  kill(rank1, SIGSTOP);
  const Result r = launcher.get();
  EXPECT_EQ(r.exit_code, 124) << r.output;
  EXPECT_NE(r.output.find("where: rank 1 has not written a record for "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" (stopped or frozen): it was in "), std::string::npos) << r.output;
  // In one of the step's all_reduces or its barrier, as the moment of the stop falls.
  EXPECT_NE(r.output.find("; rank 0 waits in "), std::string::npos) << r.output;
}

}  // namespace
}  // namespace lockstep
