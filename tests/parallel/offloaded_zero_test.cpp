// Optimizer offload under distributed data parallelism and every ZeRO stage, ranks as
// threads on cpu:0 with the "host" on cpu:1 (memory counted apart, as a GPU's is from the
// host's): one device's bits, and the optimizer state off the ranks' device.
#include <gtest/gtest.h>

#include <atomic>

#include "lockstep/core/allocator.h"
#include "lockstep/parallel/optimizer_offload.h"
#include "parallel/ddp_testing.h"
#include "parallel/rank_threads.h"
#include "parallel/step_testing.h"

namespace lockstep::parallel {
namespace {

using namespace step_testing;
using namespace ddp_testing;
using rank_threads::run_ranks;

const Device kHost = Device::cpu(1);

TEST(DistributedDataParallelOffload, EveryStageGivesOneDevicesBits) {
  const Weights one = train_dp("mlp", 1, 32, 8, 2, adamw);
  for (int stage : {0, 1, 2, 3}) {
    for (int ranks : {2, 4}) {
      const auto offloaded = train_ddp("mlp", ranks, 32, 8, 2, {.zero_stage = stage}, offload_optimizer(adamw, kHost));
      for (int r = 0; r < ranks; ++r)
        EXPECT_TRUE(same_bits(offloaded[static_cast<size_t>(r)], one))
            << "ZeRO stage " << stage << ", " << ranks << " ranks, rank " << r;
    }
  }
}

struct StepMemory {
  int64_t device_peak = 0;  // cpu:0's peak during the second step
  int64_t host = 0;         // what cpu:1 holds after it
  int64_t state = 0;        // the optimizer state of every rank
};

StepMemory second_step(int stage, bool offload) {
  StepMemory memory;
  std::atomic<int64_t> state{0};
  const int64_t host_before = memory_stats(kHost).allocated_bytes;
  const auto errors = run_ranks(4, [&](int, std::shared_ptr<comm::Communicator> comm) {
    DistributedDataParallel ddp(nn::make_model("mlp", kSeed), offload ? offload_optimizer(adamw, kHost) : adamw, comm,
                                {.loss = classification(), .micro_batch = 8, .zero_stage = stage});
    train_step(ddp, synthetic(32, 0), 0, 0);
    comm->barrier();
    if (comm->rank() == 0) reset_peak_memory_stats(Device::cpu());
    comm->barrier();
    train_step(ddp, synthetic(32, 1), 32, 1);
    comm->barrier();
    state += ddp.optimizer_state_bytes();
    if (comm->rank() == 0) {
      memory.device_peak = memory_stats(Device::cpu()).peak_allocated_bytes;
      memory.host = memory_stats(kHost).allocated_bytes - host_before;
    }
    comm->barrier();
  });
  EXPECT_EQ(errors, std::vector<std::string>(4, ""));
  memory.state = state;
  return memory;
}

// The state leaves the ranks' device: its peak falls by all of it (within the step's
// transient tensors, which threads interleave differently from run to run), and the host
// holds it with the staging buffers, one parameter and one gradient per element of state
// pair. ZeRO-1 shards it: a quarter per rank.
TEST(DistributedDataParallelOffload, TheStateLeavesTheDevice) {
  for (int stage : {0, 1}) {
    const StepMemory in_place = second_step(stage, false), offloaded = second_step(stage, true);
    EXPECT_EQ(offloaded.state, in_place.state) << "stage " << stage;
    EXPECT_GT(in_place.device_peak - offloaded.device_peak, in_place.state * 9 / 10)
        << "stage " << stage << ": cpu:0 peaked at " << in_place.device_peak << " bytes in place, "
        << offloaded.device_peak << " offloaded; the state is " << in_place.state;
    EXPECT_GE(offloaded.host, 2 * offloaded.state - 64 * 4 * 8) << "stage " << stage;
  }
}

}  // namespace
}  // namespace lockstep::parallel
