// A distributed step that runs out of memory in one process of two (`shm`, started as
// torchrun starts them): rank 1 carries ballast, so only its device runs out, while rank 0
// goes on through its buckets. Both hear of it at the step's agreement, change nothing, and
// take the step again at half the micro-batch in lockstep, ending with the weights of a run
// that used the half from the start. The weights are the one copy in shared memory the ranks
// of one host keep (ZeRO 1 and 2: each rank's parts of it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "comm/process_launcher.h"
#include "lockstep/comm/init.h"
#include "lockstep/io/weights_sha256.h"
#include "parallel/halving_testing.h"

namespace lockstep::parallel {
namespace {

using namespace halving_testing;

constexpr int64_t kLarge = 128, kSmall = 64;

bool worker(const char* mode) {
  return comm::testing::worker_mode() && std::strcmp(comm::testing::worker_mode(), mode) == 0;
}

struct MeasuredRun {
  std::string weights;     // after two steps
  int64_t first_peak = 0;  // this process's device's in the first step
  int64_t peak = 0;        // and in both
};

MeasuredRun measured(const std::shared_ptr<comm::Communicator>& comm, int stage, int64_t micro_batch) {
  empty_cache(Device::cpu());
  DistributedDataParallel ddp(make_replica(Device::cpu()).model, adamw, comm,
                              ddp_options(stage, micro_batch, /*share_weights=*/true));
  reset_peak_memory_stats(Device::cpu());
  MeasuredRun run;
  for (int64_t s = 0; s < 2; ++s) {
    ddp.step(batch_of(s), context_of(s));
    if (s == 0) run.first_peak = memory_stats(Device::cpu()).peak_allocated_bytes;
  }
  run.peak = memory_stats(Device::cpu()).peak_allocated_bytes;
  run.weights = weights_sha256(ddp.model());
  return run;
}

// ---- the worker side ----

TEST(DistributedDataParallelHalvingWorker, OneProcessRunsOut) {
  if (!worker("halving")) GTEST_SKIP() << "runs only as a rank launched by DistributedDataParallelHalving tests";
  const std::shared_ptr<comm::Communicator> comm = comm::init_process_group("shm");
  comm->set_timeout(std::chrono::seconds(30));
  ASSERT_STREQ(comm->backend(), "shm");
  for (int stage : {0, 2}) {
    const MeasuredRun small = measured(comm, stage, kSmall), large = measured(comm, stage, kLarge);
    ASSERT_GT(large.first_peak - small.peak, small.peak / 8) << "the micro-batch should decide the peak";
    // Each process's own device: rank 0 fits micro-batch 128 with room to spare; rank 1,
    // with the ballast, fits every step at 64 and not the first at 128.
    const int64_t room = (small.peak + large.first_peak) / 2;
    const int64_t limit = large.peak + (room - small.peak);
    const int64_t ballast = comm->rank() == 1 ? limit - room : 0;
    const MemoryLimit memory(limit, 1);
    DistributedDataParallel ddp(make_replica(Device::cpu()).model, adamw, comm,
                                ddp_options(stage, kLarge, /*share_weights=*/true));
    const std::string initial = weights_sha256(ddp.model());
    const Tensor held = ballast > 0 ? Tensor::empty({ballast / 4}, DType::f32, Device::cpu()) : Tensor();
    try {
      ddp.step(batch_of(0), context_of(0));
      ADD_FAILURE() << "zero" << stage << ": rank 1 did not run out";
    } catch (const OutOfMemoryError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("rank 1: out of memory on cpu:0: tried to allocate", 0), 0u)
          << "zero" << stage << ": " << e.what();
    }
    EXPECT_EQ(weights_sha256(ddp.model()), initial) << "zero" << stage << ": the failed step changed the weights";
    ASSERT_EQ(ddp.set_micro_batch(kSmall, kBatch), "");
    for (int64_t s = 0; s < 2; ++s) ddp.step(batch_of(s), context_of(s));
    EXPECT_EQ(weights_sha256(ddp.model()), small.weights) << "zero" << stage;
  }
}

// ---- the launching side ----

TEST(DistributedDataParallelHalving, OneProcessOfTwoRunsOutOverShm) {
  const auto exits = comm::testing::launch_ranks(2, "DistributedDataParallelHalvingWorker.OneProcessRunsOut",
                                                 {{"LOCKSTEP_TEST_WORKER", "halving"}});
  for (const auto& e : exits) {
    ASSERT_EQ(e.exit_code, 0) << comm::testing::describe(exits);
    EXPECT_NE(e.output.find("[  PASSED  ] 1 test"), std::string::npos) << comm::testing::describe(exits);
  }
  EXPECT_EQ(comm::testing::leftover_segments(exits), std::vector<std::string>{});
}

}  // namespace
}  // namespace lockstep::parallel
