// The shm backend: ranks as processes of one host, started the way torchrun starts them.
// Each ShmCommunicator test launches this binary as N ranks running one ShmWorker test;
// the workers skip unless launched so. After every launch /dev/shm must hold nothing of
// the job, however its ranks ended.
#include "lockstep/comm/shm_communicator.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <thread>

#include "comm/conformance.h"
#include "comm/process_launcher.h"
#include "lockstep/comm/init.h"

namespace lockstep::comm {
namespace {

using testing::describe;
using testing::launch_ranks;
using testing::leftover_segments;

bool worker(const char* mode) { return testing::worker_mode() && std::strcmp(testing::worker_mode(), mode) == 0; }

void expect_clean_success(const std::vector<testing::RankExit>& exits) {
  for (const auto& e : exits) {
    ASSERT_EQ(e.exit_code, 0) << describe(exits);
    EXPECT_NE(e.output.find("[  PASSED  ] 1 test"), std::string::npos) << describe(exits);
  }
  EXPECT_TRUE(leftover_segments(exits).empty()) << leftover_segments(exits).front();
}

// ---- the worker side ----

TEST(ShmWorker, Conformance) {
  if (!worker("conformance")) GTEST_SKIP() << "runs only as a rank launched by ShmCommunicator tests";
  std::shared_ptr<Communicator> comm = init_process_group("shm");
  EXPECT_STREQ(comm->backend(), "shm");
  testing::run_conformance(*comm);
  // Tensors in shared memory are reduced where they lie, across several staging pieces.
  const int64_t count = 300001;
  Tensor shared = comm->empty_shared({count}, DType::f32);
  for (int64_t i = 0; i < count; ++i) shared.data<float>()[i] = testing::irregular_value(comm->rank(), i);
  comm->all_reduce(shared);
  std::vector<float> column(comm->size());
  for (int64_t i = 0; i < count; i += 997) {
    for (int q = 0; q < comm->size(); ++q) column[q] = testing::irregular_value(q, i);
    ASSERT_EQ(shared.data<float>()[i], testing::reference_tree_sum(column.data(), comm->size())) << i;
  }
  testing::check_mismatch_is_named(*comm);
}

TEST(ShmWorker, OneRankIsKilled) {
  if (!worker("killed")) GTEST_SKIP() << "runs only as a rank launched by ShmCommunicator tests";
  std::shared_ptr<Communicator> comm = init_process_group("shm");
  if (comm->rank() == 1) raise(SIGKILL);
  Tensor t = Tensor::ones({1000});
  try {
    comm->all_reduce(t);
    FAIL() << "all_reduce with a dead rank returned";
  } catch (const CommError& error) {
    // Found by its pid, not by the (long) timeout; or reported by another rank that did.
    const std::string message = error.what();
    EXPECT_NE(message.find("rank 1 (pid "), std::string::npos) << message;
    EXPECT_NE(message.find("died"), std::string::npos) << message;
  }
}

TEST(ShmWorker, OneRankIsLate) {
  if (!worker("late")) GTEST_SKIP() << "runs only as a rank launched by ShmCommunicator tests";
  std::shared_ptr<Communicator> comm = init_process_group("shm");
  if (comm->rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(2));
  Tensor t = Tensor::ones({1000});
  try {
    comm->all_reduce(t);
    FAIL() << "all_reduce returned although rank 1 came after the timeout";
  } catch (const CommError& error) {
    const std::string message = error.what();
    if (comm->rank() == 0) {
      EXPECT_NE(message.find("all_reduce #1"), std::string::npos) << message;
      EXPECT_NE(message.find("for rank 1 of 2 and gave up"), std::string::npos) << message;
    } else {
      EXPECT_NE(message.find("rank 0 of 2 failed"), std::string::npos) << message;
    }
  }
}

TEST(ShmWorker, OneRankNeverJoins) {
  if (!worker("absent")) GTEST_SKIP() << "runs only as a rank launched by ShmCommunicator tests";
  if (std::getenv("RANK") == std::string("1")) return;
  try {
    init_process_group("shm");
    FAIL() << "the rendezvous completed without rank 1";
  } catch (const CommError& error) {
    EXPECT_NE(std::string(error.what()).find("1"), std::string::npos) << error.what();
  }
}

TEST(ShmWorker, NoRoomInDevShm) {
  if (!worker("noroom")) GTEST_SKIP() << "runs only as a rank launched by ShmCommunicator tests";
  try {
    init_process_group("shm");
    FAIL() << "a staging segment larger than /dev/shm was accepted";
  } catch (const Error& error) {
    // Every rank runs out of room; one that is still meeting when rank 0 (the store's
    // server) gives up reports that instead, pointing at rank 0's output.
    const std::string message = error.what();
    if (message.find("lost the rendezvous store") != std::string::npos && std::getenv("RANK") != std::string("0")) {
      EXPECT_NE(message.find("see rank 0's output"), std::string::npos) << message;
      return;
    }
    EXPECT_NE(message.find("cannot reserve"), std::string::npos) << message;
    EXPECT_NE(message.find("--shm-size"), std::string::npos) << message;
  }
}

// ---- the launching side ----

class ShmConformance : public ::testing::TestWithParam<int> {};

TEST_P(ShmConformance, AllCollectives) {
  expect_clean_success(launch_ranks(GetParam(), "ShmWorker.Conformance", {{"LOCKSTEP_TEST_WORKER", "conformance"}}));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmConformance, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& info) { return "ranks" + std::to_string(info.param); });

TEST(ShmCommunicator, SmallStagingCutsCollectivesIntoPieces) {
  expect_clean_success(launch_ranks(
      3, "ShmWorker.Conformance", {{"LOCKSTEP_TEST_WORKER", "conformance"}, {"LOCKSTEP_SHM_STAGING_BYTES", "65536"}}));
}

TEST(ShmCommunicator, KilledRankIsNamedAndNothingIsLeftBehind) {
  const auto exits = launch_ranks(3, "ShmWorker.OneRankIsKilled",
                                  {{"LOCKSTEP_TEST_WORKER", "killed"}, {"LOCKSTEP_COMM_TIMEOUT", "300"}});
  ASSERT_EQ(exits[1].signal, SIGKILL) << describe(exits);
  for (int r : {0, 2}) {
    EXPECT_EQ(exits[r].exit_code, 0) << describe(exits);
    EXPECT_NE(exits[r].output.find("[  PASSED  ] 1 test"), std::string::npos) << describe(exits);
  }
  EXPECT_TRUE(leftover_segments(exits).empty()) << describe(exits);
}

TEST(ShmCommunicator, LateRankTimesOutNamingIt) {
  expect_clean_success(
      launch_ranks(2, "ShmWorker.OneRankIsLate", {{"LOCKSTEP_TEST_WORKER", "late"}, {"LOCKSTEP_COMM_TIMEOUT", "0.5"}}));
}

TEST(ShmCommunicator, RankThatNeverJoinsFailsTheRendezvous) {
  expect_clean_success(launch_ranks(2, "ShmWorker.OneRankNeverJoins",
                                    {{"LOCKSTEP_TEST_WORKER", "absent"}, {"LOCKSTEP_COMM_TIMEOUT", "1"}}));
}

TEST(ShmCommunicator, FullDevShmIsAClearErrorAtStartup) {
  // 1 PiB of staging per rank: no /dev/shm has room, and the error must say so up front.
  expect_clean_success(launch_ranks(2, "ShmWorker.NoRoomInDevShm",
                                    {{"LOCKSTEP_TEST_WORKER", "noroom"},
                                     {"LOCKSTEP_SHM_STAGING_BYTES", "1125899906842624"},
                                     {"LOCKSTEP_COMM_TIMEOUT", "5"}}));
}

}  // namespace
}  // namespace lockstep::comm
