// ZeRO under distributed data parallelism, ranks as threads over the `local` backend:
// stage 1 (optimizer state sharded) and stage 2 (reduced gradients too) give one device's
// weights bit for bit, whatever the rank count, the micro-batches per rank, the bucket
// sizes or the optimizer; every stage's checkpoint state is one unsharded optimizer's and
// resumes on any layout; stage 2 holds a rank's share of the gradients instead of all of
// them, stage 3 (zero3_test.cpp) a rank's share of the weights as well. The process
// backends run it through `lockstep train --strategy zero1|zero2|zero3`.
#include <gtest/gtest.h>

#include <optional>

#include "lockstep/core/allocator.h"
#include "lockstep/nn/activation.h"
#include "lockstep/nn/flatten.h"
#include "lockstep/nn/init.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/sequential.h"
#include "lockstep/parallel/distributed_data_parallel.h"
#include "parallel/ddp_testing.h"
#include "parallel/rank_threads.h"
#include "parallel/step_testing.h"

namespace lockstep::parallel {
namespace {

using namespace step_testing;
using namespace ddp_testing;
using rank_threads::run_ranks;

// 32 samples in micro-batches of 4 are 2 per rank on 4 ranks (earlier micro-batches folded
// locally); of 8, one per rank (where stage 2 reduce-scatters everything backward makes).
// Threads share one copy of the weights (a barrier after the update), or each keeps its own
// (the parts all-gathered, as between GPUs or hosts).
TEST(Zero, EveryStageGivesOneDevicesBits) {
  for (const auto& [name, make_optimizer] : {std::pair<const char*, OptimizerFactory>{"sgd", sgd},
                                             std::pair<const char*, OptimizerFactory>{"adamw", adamw}}) {
    for (int64_t micro : {4, 8}) {
      const Weights one = train_dp("mlp", 1, 32, micro, 2, make_optimizer);
      for (int stage : {1, 2}) {
        for (const auto& [ranks, share] : {std::pair{1, true}, {2, false}, {4, true}, {4, false}}) {
          const auto sharded =
              train_ddp("mlp", ranks, 32, micro, 2, {.zero_stage = stage, .share_weights = share}, make_optimizer);
          for (int r = 0; r < ranks; ++r)
            EXPECT_TRUE(same_bits(sharded[static_cast<size_t>(r)], one))
                << name << ", micro-batch " << micro << ", stage " << stage << ", " << ranks << " ranks"
                << (share ? "" : " with weights of their own") << ", rank " << r;
        }
      }
    }
  }
}

// Buckets of 4 KiB (the first of 1 KiB) cut the MLP into hundreds of units, most of them
// padded to a multiple of the rank count; the CNN's tensors are of every size, down to a bias of 8.
TEST(Zero, StageTwoKeepsTheBitsWhateverTheBuckets) {
  const Weights mlp = train_dp("mlp", 1, 32, 4, 2);
  for (int ranks : {2, 4}) {
    const auto small =
        train_ddp("mlp", ranks, 32, 4, 2, {.bucket_bytes = 4096, .first_bucket_bytes = 1024, .zero_stage = 2});
    EXPECT_TRUE(same_bits(small[static_cast<size_t>(ranks - 1)], mlp)) << ranks << " ranks";
  }
  const auto one_bucket =
      train_ddp("mlp", 2, 32, 4, 2, {.bucket_bytes = int64_t{1} << 30, .first_bucket_bytes = 1 << 30, .zero_stage = 2});
  EXPECT_TRUE(same_bits(one_bucket[1], mlp));
  EXPECT_TRUE(
      same_bits(train_ddp("cnn", 4, 16, 4, 2, {.zero_stage = 2}, adamw)[3], train_dp("cnn", 1, 16, 4, 2, adamw)));
}

// What a run leaves for a checkpoint: the weights, and the optimizer state as every rank
// gathers it and as rank 1 alone assembles it.
struct Saved {
  NamedTensors model, gathered;
  std::vector<NamedTensors> on_rank_1;
  Weights weights;
};

// Steps [first, first + steps) of AdamW on a global batch of 16, from a checkpoint's state
// when there is one.
Saved train(int ranks, int stage, int first, int steps, const std::optional<Saved>& from = std::nullopt) {
  Saved saved;
  saved.on_rank_1.resize(static_cast<size_t>(ranks));
  const auto errors = run_ranks(ranks, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    auto model = nn::make_model("mlp", kSeed);
    DistributedDataParallel ddp(model, adamw, comm, {.loss = classification(), .micro_batch = 4, .zero_stage = stage});
    if (from) {
      ddp.load_model_state(from->model);
      ddp.load_optimizer_state(from->gathered);
    }
    for (int s = first; s < first + steps; ++s)
      train_step(ddp, synthetic(16, static_cast<uint64_t>(s)), s * 16, static_cast<uint64_t>(s));
    const NamedTensors gathered = ddp.optimizer_state();
    saved.on_rank_1[static_cast<size_t>(rank)] = ddp.optimizer_state_on(std::min(1, ranks - 1));
    nn::Module& full = ddp.model();  // collective under ZeRO-3
    if (rank == 0) {
      saved.gathered = gathered;
      saved.model = full.state_dict();
      for (auto& [name, tensor] : saved.model) tensor = tensor.clone();
      saved.weights = weights(full);
    }
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  return saved;
}

std::vector<std::pair<std::string, std::vector<float>>> values(const NamedTensors& state) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (const auto& [name, tensor] : state) out.emplace_back(name, tensor.to(DType::f32).to_vector<float>());
  return out;
}

// Every stage's state is the unsharded optimizer's, bit for bit and name for name; on rank
// 1 alone where it is assembled for a checkpoint (the others send and hold nothing).
TEST(Zero, TheCheckpointStateIsOneOptimizersOnEveryStage) {
  const auto whole = values(train(1, 0, 0, 2).gathered);
  ASSERT_FALSE(whole.empty());
  for (int stage : {0, 1, 2, 3}) {
    const Saved saved = train(4, stage, 0, 2);
    EXPECT_EQ(values(saved.gathered), whole) << "stage " << stage;
    EXPECT_EQ(values(saved.on_rank_1[1]), whole) << "stage " << stage;
    for (int rank : {0, 2, 3})
      EXPECT_TRUE(saved.on_rank_1[static_cast<size_t>(rank)].empty()) << "stage " << stage << ", rank " << rank;
  }
}

// Saved by stage 2 or 3 on 4 ranks and resumed by ddp on 2, or saved by ddp and resumed by
// stage 2 or 3: the weights of 4 uninterrupted steps on one device.
TEST(Zero, StagesTwoAndThreeResumeOnAnyLayoutAndFromAny) {
  const Weights whole = train(1, 0, 0, 4).weights;
  EXPECT_TRUE(same_bits(train(2, 0, 2, 2, train(4, 2, 0, 2)).weights, whole));
  EXPECT_TRUE(same_bits(train(4, 2, 2, 2, train(2, 0, 0, 2)).weights, whole));
  EXPECT_TRUE(same_bits(train(2, 2, 3, 1, train(4, 1, 0, 3)).weights, whole));
  EXPECT_TRUE(same_bits(train(2, 0, 2, 2, train(4, 3, 0, 2)).weights, whole));
  EXPECT_TRUE(same_bits(train(4, 3, 1, 3, train(2, 2, 0, 1)).weights, whole));
}

// 32 layers of 128 x 128: 2.2 MB of gradients in tensors of 64 KiB, so that a bucket or
// two is little next to the whole, as in a large model.
std::shared_ptr<nn::Module> deep_narrow_mlp() {
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Flatten>());
  model->push_back(std::make_shared<nn::Linear>(784, 128));
  for (int layer = 0; layer < 32; ++layer) {
    model->push_back(std::make_shared<nn::ReLU>());
    model->push_back(std::make_shared<nn::Linear>(128, 128));
  }
  model->push_back(std::make_shared<nn::Linear>(128, 10));
  nn::initialize(*model, kSeed);
  return model;
}

// The bytes the process holds at the peak of a step, four ranks in it, each on one
// micro-batch, after a first step has made everything that lasts.
// share_weights false: each rank its own copy of the weights (as between GPUs).
int64_t peak_of_a_step(int stage, int64_t bucket_bytes, bool share_weights = true) {
  int64_t peak = 0;
  const auto errors = run_ranks(4, [&](int, std::shared_ptr<comm::Communicator> comm) {
    DistributedDataParallel ddp(deep_narrow_mlp(), adamw, comm,
                                {.loss = classification(),
                                 .micro_batch = 8,
                                 .bucket_bytes = bucket_bytes,
                                 .first_bucket_bytes = bucket_bytes,
                                 .zero_stage = stage,
                                 .share_weights = share_weights});
    train_step(ddp, synthetic(32, 0), 0, 0);
    comm->barrier();
    if (comm->rank() == 0) reset_peak_memory_stats(Device::cpu());
    comm->barrier();
    train_step(ddp, synthetic(32, 1), 32, 1);
    comm->barrier();
    if (comm->rank() == 0) peak = memory_stats(Device::cpu()).peak_allocated_bytes;
  });
  EXPECT_EQ(errors, std::vector<std::string>(4, ""));
  return peak;
}

// Stage 1 holds every rank's reduced gradients whole; stage 2 a quarter of them, and the
// buckets still filling or in flight: it saves each rank three quarters of G, less those.
TEST(Zero, StageTwoHoldsItsShareOfTheGradients) {
  const int64_t gradient_bytes = deep_narrow_mlp()->num_parameters() * 4, bucket = 64 << 10;
  const int64_t stage1 = peak_of_a_step(1, bucket), stage2 = peak_of_a_step(2, bucket);
  EXPECT_GT(stage1 - stage2, 4 * (gradient_bytes * 3 / 4 - 6 * bucket))
      << "stage 1 peaked at " << stage1 << " bytes, stage 2 at " << stage2 << "; the gradients are " << gradient_bytes;
}

// Stage 2 with a copy of the weights per rank holds 4 W; stage 3 a quarter of W per rank,
// and the units it has gathered: the first layer (784 x 128, 0.4 MB) and two of 128 x 128
// at most at a time. The model's children are its units.
TEST(Zero, StageThreeHoldsItsShareOfTheWeights) {
  const int64_t weight_bytes = deep_narrow_mlp()->num_parameters() * 4, bucket = 64 << 10;
  const int64_t gathered = (784 * 128 + 2 * 128 * 128 + 3 * 128) * 4;
  const int64_t stage2 = peak_of_a_step(2, bucket, false), stage3 = peak_of_a_step(3, bucket, false);
  EXPECT_GT(stage2 - stage3, 4 * (weight_bytes * 3 / 4 - gathered))
      << "stage 2 peaked at " << stage2 << " bytes, stage 3 at " << stage3 << "; the weights are " << weight_bytes;
}

TEST(Zero, AStageItDoesNotHaveIsExplained) {
  const auto errors = run_ranks(1, [&](int, std::shared_ptr<comm::Communicator> comm) {
    DistributedDataParallel ddp(nn::make_model("mlp", kSeed), sgd, comm, {.loss = classification(), .zero_stage = 4});
  });
  EXPECT_NE(errors[0].find("ZeRO stage 4"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace lockstep::parallel
