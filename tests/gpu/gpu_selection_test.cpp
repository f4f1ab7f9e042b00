// select_gpus on hand-built hosts: every rule of `--gpus auto|LIST --min-free-memory`.
#include "lockstep/gpu/gpu_selection.h"

#include <gtest/gtest.h>

#include "lockstep/core/error.h"

namespace lockstep::gpu {
namespace {

constexpr uint64_t GiB = 1ull << 30;
constexpr uint32_t kMe = 1000, kOther = 1001;

// `free_gib[i]` free of 80 GiB on GPU i, `busy[i]` percent utilization.
GpuState host(const std::vector<uint64_t>& free_gib, const std::vector<unsigned>& busy = {}) {
  GpuState state;
  for (size_t i = 0; i < free_gib.size(); ++i) {
    GpuDevice d;
    d.index = static_cast<unsigned>(i);
    d.memory_total = 80 * GiB;
    d.memory_free = free_gib[i] * GiB;
    d.memory_used = d.memory_total - d.memory_free;
    d.utilization_gpu = i < busy.size() ? busy[i] : 0;
    state.devices.push_back(d);
  }
  return state;
}

void add_process(GpuState& state, unsigned gpu, uint32_t uid, bool visible = true) {
  GpuProcess p;
  p.pid = 4242 + gpu;
  p.uid = uid;
  p.user = uid == kMe ? "me" : "bob";
  p.in_this_namespace = visible;
  p.used_bytes = 30 * GiB;
  state.devices[gpu].processes.push_back(p);
}

GpuRequest want(int count, uint64_t min_free_gib = 0) {
  GpuRequest r;
  r.count = count;
  r.min_free_bytes = min_free_gib * GiB;
  r.uid = kMe;
  return r;
}

TEST(GpuSelection, AutoTakesTheMostFreeMemoryThenTheLeastBusyAndRanksThemInBusOrder) {
  const GpuState state = host({40, 80, 80, 70}, {0, 50, 10, 0});
  // GPUs 1 and 2 have the most free memory; of two more with 80 GiB free... only two asked.
  EXPECT_EQ(select_gpus(state, want(2)).chosen, (std::vector<unsigned>{1, 2}));
  // Three: next is GPU 3 (70 GiB); ranks follow the bus.
  EXPECT_EQ(select_gpus(state, want(3)).chosen, (std::vector<unsigned>{1, 2, 3}));
  // Equal free memory: the less busy one wins.
  EXPECT_EQ(select_gpus(state, want(1)).chosen, (std::vector<unsigned>{2}));
}

TEST(GpuSelection, AutoSkipsGpusOtherUsersHoldButNotOurOwn) {
  GpuState state = host({80, 80, 80, 80});
  add_process(state, 0, kOther);
  add_process(state, 1, kOther, /*visible=*/false);
  add_process(state, 2, kMe);
  EXPECT_EQ(select_gpus(state, want(2)).chosen, (std::vector<unsigned>{2, 3}));
  const GpuSelection three = select_gpus(state, want(3));
  EXPECT_TRUE(three.chosen.empty());
  EXPECT_NE(three.waiting_for.find("2 of 3 GPUs are free"), std::string::npos) << three.waiting_for;
  EXPECT_NE(three.waiting_for.find("GPU 0 is held by pid 4242 (user bob, 30.0 GiB)"), std::string::npos)
      << three.waiting_for;
  EXPECT_NE(three.waiting_for.find("GPU 1 is held by pid 4243 (outside this PID namespace"), std::string::npos)
      << three.waiting_for;
  EXPECT_EQ(foreign_bytes(state.devices[0], kMe), 30 * GiB);
  EXPECT_EQ(foreign_bytes(state.devices[2], kMe), 0u);
}

TEST(GpuSelection, MinimumFreeMemoryWaitsBothForAutoAndForAList) {
  const GpuState state = host({9, 10, 11});
  EXPECT_EQ(select_gpus(state, want(2, 10)).chosen, (std::vector<unsigned>{1, 2}));
  const GpuSelection waiting = select_gpus(state, want(3, 10));
  EXPECT_TRUE(waiting.chosen.empty());
  EXPECT_NE(waiting.waiting_for.find("GPU 0 has 9.0 GiB free, under the 10.0 GiB asked"), std::string::npos)
      << waiting.waiting_for;

  GpuRequest listed = want(2, 10);
  listed.indices = std::vector<unsigned>{2, 0};
  const GpuSelection blocked = select_gpus(state, listed);
  EXPECT_TRUE(blocked.chosen.empty());
  EXPECT_NE(blocked.waiting_for.find("GPU 0 has 9.0 GiB free"), std::string::npos) << blocked.waiting_for;
  listed.indices = std::vector<unsigned>{2, 1};
  EXPECT_EQ(select_gpus(state, listed).chosen, (std::vector<unsigned>{2, 1}));  // the order given
}

TEST(GpuSelection, AListMayNameAGpuOthersUseButNotOneThatIsNotThere) {
  GpuState state = host({80, 80});
  add_process(state, 0, kOther);
  GpuRequest listed = want(1);
  listed.indices = std::vector<unsigned>{0};
  EXPECT_EQ(select_gpus(state, listed).chosen, (std::vector<unsigned>{0}));  // the user asked for it

  listed.indices = std::vector<unsigned>{5};
  try {
    select_gpus(state, listed);
    FAIL() << "GPU 5 does not exist";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("there is no GPU 5 on this host (the GPUs are 0,1"), std::string::npos)
        << e.what();
  }
  listed.indices = std::vector<unsigned>{1, 1};
  listed.count = 2;
  EXPECT_THROW(select_gpus(state, listed), UsageError);  // twice
  listed.indices = std::vector<unsigned>{0, 1};
  listed.count = 3;
  EXPECT_THROW(select_gpus(state, listed), UsageError);  // one per worker
}

TEST(GpuSelection, RespectsTheLaunchersVisibleDevices) {
  const GpuState state = host({80, 80, 80, 80});
  GpuRequest request = want(2);
  request.allowed = std::vector<unsigned>{1, 3};
  EXPECT_EQ(select_gpus(state, request).chosen, (std::vector<unsigned>{1, 3}));
  request.count = 3;
  try {
    select_gpus(state, request);
    FAIL() << "only two are visible";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("there are 2 visible through CUDA_VISIBLE_DEVICES"), std::string::npos)
        << e.what();
  }
  request.count = 1;
  request.indices = std::vector<unsigned>{0};
  EXPECT_THROW(select_gpus(state, request), UsageError);
}

TEST(GpuSelection, MoreWorkersThanGpusIsAnErrorNotAWait) {
  EXPECT_THROW(select_gpus(host({80, 80}), want(3)), UsageError);
  EXPECT_THROW(select_gpus(GpuState{}, want(1)), UsageError);
}

TEST(GpuSelection, ParsesAListOfIndices) {
  EXPECT_EQ(parse_gpu_list("0,2,3"), (std::vector<unsigned>{0, 2, 3}));
  EXPECT_EQ(parse_gpu_list("7"), (std::vector<unsigned>{7}));
  for (const char* bad : {"", "0,", ",1", "a", "0,-1", "1.5", "GPU-12"}) {
    EXPECT_THROW(parse_gpu_list(bad), UsageError) << bad;
  }
}

}  // namespace
}  // namespace lockstep::gpu
