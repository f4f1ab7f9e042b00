// The caching allocator's cudaFree waits for every stream of the GPU: it must wait for the
// nccl backend's calls in flight to drain and hold new ones back (CommunicationScope,
// without_communication), and fail at once where the waiting thread is itself inside one.
// Host logic only: these run without a GPU (the GPU numbers are labels).
#include <gtest/gtest.h>

#if LOCKSTEP_HAVE_CUDA

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "lockstep/core/cuda/runtime.h"
#include "lockstep/core/error.h"

namespace lockstep::cuda {
namespace {

using namespace std::chrono_literals;

// Polls until flag is set, for at most 10 s.
bool becomes_true(const std::atomic<bool>& flag) {
  for (int i = 0; i < 1000 && !flag.load(); ++i) std::this_thread::sleep_for(10ms);
  return flag.load();
}

TEST(CudaCommunicationScope, AFreeWaitsUntilTheCallsInFlightOnItsGpuEnd) {
  constexpr int kGpu = 1001;
  std::atomic<bool> opened{false}, close{false}, freed{false};
  std::thread collective([&] {
    const CommunicationScope in_flight(kGpu);
    opened = true;
    while (!close.load()) std::this_thread::sleep_for(1ms);
  });
  ASSERT_TRUE(becomes_true(opened));
  std::thread allocator([&] { without_communication(kGpu, "empty_cache", [&] { freed = true; }); });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(freed.load()) << "cudaFree ran while an NCCL call was in flight on the GPU";
  // Another GPU's calls are no reason to wait.
  bool other = false;
  without_communication(kGpu + 1, "empty_cache", [&] { other = true; });
  EXPECT_TRUE(other);
  close = true;
  collective.join();
  allocator.join();
  EXPECT_TRUE(freed.load());
}

TEST(CudaCommunicationScope, NewCallsWaitWhileAFreeRuns) {
  constexpr int kGpu = 1002;
  std::atomic<bool> freeing{false}, finish{false}, finished{false}, entered{false};
  std::thread allocator([&] {
    without_communication(kGpu, "empty_cache", [&] {
      freeing = true;
      while (!finish.load()) std::this_thread::sleep_for(1ms);
      finished = true;
    });
  });
  ASSERT_TRUE(becomes_true(freeing));
  std::thread collective([&] {
    const CommunicationScope in_flight(kGpu);
    EXPECT_TRUE(finished.load()) << "an NCCL call started during the free";
    entered = true;
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(entered.load());
  finish = true;
  allocator.join();
  collective.join();
  EXPECT_TRUE(entered.load());
}

TEST(CudaCommunicationScope, AThreadInsideACallFailsAtOnceInsteadOfWaitingForItself) {
  constexpr int kGpu = 1003;
  const CommunicationScope in_flight(kGpu);
  bool freed = false;
  try {
    without_communication(kGpu, "emptying the CUDA cache after an out-of-memory error", [&] { freed = true; });
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("out-of-memory"), std::string::npos) << message;
    EXPECT_NE(message.find("GPU 1003"), std::string::npos) << message;
  }
  EXPECT_FALSE(freed);
}

TEST(CudaCommunicationScope, AFreeThatThrowsLetsTheCallsGoOn) {
  constexpr int kGpu = 1004;
  EXPECT_THROW(without_communication(kGpu, "empty_cache", [] { throw std::runtime_error("cudaFree failed"); }),
               std::runtime_error);
  std::atomic<bool> entered{false};
  std::thread collective([&] {
    const CommunicationScope in_flight(kGpu);
    entered = true;
  });
  EXPECT_TRUE(becomes_true(entered));
  collective.join();
}

}  // namespace
}  // namespace lockstep::cuda

#else

TEST(CudaCommunicationScope, NotBuilt) { GTEST_SKIP() << "this build has no CUDA backend"; }

#endif
