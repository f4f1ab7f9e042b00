#include "lockstep/parallel/device_workers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "lockstep/core/parallel.h"

namespace lockstep::parallel {
namespace {

TEST(DeviceWorkers, RunsEveryDeviceOncePerRunWithItsThreadCount) {
  DeviceWorkers workers(3, 2, nullptr);
  std::vector<int> runs(3, 0), threads(3, 0);
  for (int r = 0; r < 50; ++r) {
    workers.run([&](int d) {
      ++runs[static_cast<size_t>(d)];
      threads[static_cast<size_t>(d)] = num_threads();
    });
  }
  EXPECT_EQ(runs, std::vector<int>(3, 50));
  EXPECT_EQ(threads, std::vector<int>(3, 2));
}

// Runs that come while the workers still poll for them, and runs that come after they have
// gone to sleep (a gap longer than the poll): both reach every device once. One worker is
// slow, so the caller also waits past its poll.
TEST(DeviceWorkers, RunsComeThroughWhetherTheWorkersPollOrSleep) {
  DeviceWorkers workers(3, 1, nullptr);
  std::vector<std::atomic<int>> runs(3);
  for (int r = 0; r < 6; ++r) {
    workers.run([&](int d) {
      if (d == 2 && r % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ++runs[static_cast<size_t>(d)];
    });
    if (r % 3 == 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (const auto& n : runs) EXPECT_EQ(n.load(), 6);
}

TEST(DeviceWorkers, RethrowsTheCauseNotTheErrorsItCaused) {
  std::atomic<bool> told{false};
  int told_device = -1;
  DeviceWorkers workers(2, 1, [&](int d, const std::string&) {
    if (!told.exchange(true)) told_device = d;
  });
  try {
    workers.run([&](int d) {
      if (d == 1) throw std::runtime_error("the cause, on device 1");
      while (!told.load()) std::this_thread::yield();  // device 0 fails because device 1 did
      throw std::runtime_error("a consequence, on device 0");
    });
    FAIL() << "no error";
  } catch (const std::runtime_error& error) {
    EXPECT_STREQ(error.what(), "the cause, on device 1");
  }
  EXPECT_EQ(told_device, 1);
  // The workers are still there for the next run.
  std::atomic<int> ran{0};
  workers.run([&](int) { ++ran; });
  EXPECT_EQ(ran.load(), 2);
}

TEST(DeviceWorkers, RejectsNoDevicesOrNoThreads) {
  EXPECT_ANY_THROW(DeviceWorkers(0, 1, nullptr));
  EXPECT_ANY_THROW(DeviceWorkers(2, 0, nullptr));
}

}  // namespace
}  // namespace lockstep::parallel
