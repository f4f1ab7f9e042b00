// Distributed data parallelism with ranks as threads over the `local` backend: the weights
// are the bits of DataParallel on as many devices (and of one device), whatever the bucket
// sizes; rank 0's weights reach every rank; unused parameters and a failing rank are
// handled. The process backends run it through `lockstep train --strategy ddp`.
#include "lockstep/parallel/distributed_data_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "lockstep/comm/local_communicator.h"
#include "lockstep/core/allocator.h"
#include "lockstep/core/parallel.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/models.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/parallel/data_parallel.h"
#include "parallel/ddp_testing.h"
#include "parallel/rank_threads.h"
#include "parallel/step_testing.h"

namespace lockstep::parallel {
namespace {

using namespace step_testing;
using namespace ddp_testing;
using rank_threads::run_ranks;

TEST(DistributedDataParallel, SameBitsAsDataParallelAndOneDevice) {
  const Weights one = train_dp("mlp", 1, 32, 4, 3);
  for (int ranks : {1, 2, 4}) {
    const std::vector<Weights> ranks_weights = train_ddp("mlp", ranks, 32, 4, 3);
    for (int r = 0; r < ranks; ++r)
      EXPECT_TRUE(same_bits(ranks_weights[static_cast<size_t>(r)], one)) << ranks << " ranks, rank " << r;
  }
}

TEST(DistributedDataParallel, BucketSizesDoNotChangeTheBits) {
  // Buckets of 4 KiB (the first 1 KiB) split the MLP's 2.7 MB of gradients into hundreds of
  // all-reduces; one bucket of everything is a single one.
  const auto many = train_ddp("mlp", 2, 16, 4, 2, {.bucket_bytes = 4096, .first_bucket_bytes = 1024});
  const auto one = train_ddp("mlp", 2, 16, 4, 2, {.bucket_bytes = int64_t{1} << 30, .first_bucket_bytes = 1 << 30});
  EXPECT_TRUE(same_bits(many[0], one[0]));
  EXPECT_TRUE(same_bits(train_ddp("cnn", 2, 16, 4, 1)[1], train_dp("cnn", 1, 16, 4, 1)));
}

// bf16 gradients between ranks: every node of the tree rounds to bf16, so 1, 2 and 4 ranks
// still agree bit for bit; the weights move away from f32's, but only by bf16's rounding.
TEST(DistributedDataParallel, BfloatGradientsKeepTheBitsOnEveryRankCount) {
  const DistributedDataParallelOptions bf16{.gradient_dtype = DType::bf16};
  const Weights one = train_ddp("mlp", 1, 32, 4, 3, bf16)[0];
  for (int ranks : {2, 4}) {
    const std::vector<Weights> ranks_weights = train_ddp("mlp", ranks, 32, 4, 3, bf16);
    for (int r = 0; r < ranks; ++r)
      EXPECT_TRUE(same_bits(ranks_weights[static_cast<size_t>(r)], one)) << ranks << " ranks, rank " << r;
  }
  const Weights f32 = train_dp("mlp", 1, 32, 4, 3);
  EXPECT_FALSE(same_bits(one, f32));
  double largest = 0;
  for (size_t t = 0; t < f32.size(); ++t)
    for (size_t i = 0; i < f32[t].size(); ++i) largest = std::max(largest, std::abs(double{one[t][i]} - f32[t][i]));
  EXPECT_LT(largest, 1e-3) << "3 SGD steps of lr 0.1 on bf16-rounded gradients";
}

TEST(DistributedDataParallel, BfloatGradientsRefuseWhatTheyCannotDo) {
  const auto errors = run_ranks(2, [&](int, std::shared_ptr<comm::Communicator> comm) {
    DistributedDataParallel ddp(nn::make_model("mlp", kSeed), sgd, comm,
                                {.loss = classification(), .zero_stage = 1, .gradient_dtype = DType::bf16});
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("not supported with ZeRO yet: use zero_stage 0"), std::string::npos) << e;
}

// Local SGD on one rank is plain ddp: its averaging of one replica changes nothing.
TEST(DistributedDataParallel, LocalSgdOnOneRankIsPlainDdp) {
  EXPECT_TRUE(same_bits(train_ddp("mlp", 1, 32, 4, 5, {.sync_every = 4})[0], train_ddp("mlp", 1, 32, 4, 5)[0]));
}

// Two ranks, averaged every 4 steps, against two independent one-rank runs on the shares,
// whose weights and momenta this test averages itself as (a + b) / 2 after steps 4 and 8.
TEST(DistributedDataParallel, LocalSgdIsTwoReplicasAveragedEveryKSteps) {
  const int64_t batch = 32, micro = 4, share = batch / 2;
  const int steps = 8, every = 4;
  std::vector<Weights> ours(2);
  std::vector<std::vector<bool>> agreed(2);
  const auto errors = run_ranks(2, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    auto model = nn::make_model("mlp", kSeed);
    DistributedDataParallel ddp(model, sgd, comm,
                                {.loss = classification(), .micro_batch = micro, .sync_every = every});
    for (int s = 0; s < steps; ++s) {
      const Data data = synthetic(batch, static_cast<uint64_t>(s));
      ddp.step_on_share(as_batch(data).slice(rank * share, share),
                        {.seed = kSeed, .step = static_cast<uint64_t>(s), .first_sample = s * batch + rank * share});
      agreed[static_cast<size_t>(rank)].push_back(ddp.replicas_agree());
    }
    ours[static_cast<size_t>(rank)] = weights(*model);
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");

  // The reference: each share trained alone, as a job of one (on a thread of one compute
  // thread, as the ranks).
  Weights reference;
  const auto reference_failures = run_ranks(1, [&](int, std::shared_ptr<comm::Communicator>) {
    std::vector<std::shared_ptr<nn::Module>> models;
    std::vector<std::unique_ptr<DistributedDataParallel>> alone;
    for (int r = 0; r < 2; ++r) {
      models.push_back(nn::make_model("mlp", kSeed));
      alone.push_back(std::make_unique<DistributedDataParallel>(
          models.back(), sgd, comm::LocalCommunicator::create_group(1)[0],
          DistributedDataParallelOptions{.loss = classification(), .micro_batch = micro}));
    }
    const auto average_into_both = [](const Tensor& a, const Tensor& b) {
      float* x = a.data_ptr<float>();
      float* y = b.data_ptr<float>();
      for (int64_t i = 0; i < a.numel(); ++i) x[i] = y[i] = (x[i] + y[i]) / 2.0f;
    };
    for (int s = 0; s < steps; ++s) {
      const Data data = synthetic(batch, static_cast<uint64_t>(s));
      for (int r = 0; r < 2; ++r) {
        alone[static_cast<size_t>(r)]->step_on_share(
            as_batch(data).slice(r * share, share),
            {.seed = kSeed, .step = static_cast<uint64_t>(s), .first_sample = s * batch + r * share});
      }
      if ((s + 1) % every != 0) continue;
      const NamedTensors w0 = models[0]->state_dict(), w1 = models[1]->state_dict();
      for (size_t i = 0; i < w0.size(); ++i) average_into_both(w0[i].second, w1[i].second);
      NamedTensors m0 = alone[0]->optimizer_state(), m1 = alone[1]->optimizer_state();
      for (size_t i = 0; i < m0.size(); ++i) {
        if (m0[i].second.dtype() == DType::f32) average_into_both(m0[i].second, m1[i].second);
      }
      alone[0]->load_optimizer_state(m0);
      alone[1]->load_optimizer_state(m1);
    }
    reference = weights(*models[0]);
  });
  for (const std::string& e : reference_failures) ASSERT_EQ(e, "");
  EXPECT_TRUE(same_bits(ours[0], ours[1]));
  EXPECT_TRUE(same_bits(ours[0], reference));
  EXPECT_FALSE(same_bits(ours[0], train_ddp("mlp", 2, batch, micro, steps)[0])) << "local SGD is not plain ddp";
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(agreed[static_cast<size_t>(r)],
              (std::vector<bool>{false, false, false, true, false, false, false, true}));
  }
}

// PowerSGD from step 1: one approximation on every rank, so the replicas stay equal; step 0
// (before it starts) is plain ddp's.
TEST(DistributedDataParallel, PowerSgdKeepsTheReplicasEqual) {
  const DistributedDataParallelOptions powersgd{.powersgd_rank = 2, .powersgd_start_step = 1};
  const auto compressed = train_ddp("mlp", 2, 32, 4, 4, powersgd);
  EXPECT_TRUE(same_bits(compressed[0], compressed[1]));
  EXPECT_FALSE(same_bits(compressed[0], train_ddp("mlp", 2, 32, 4, 4)[0]));
  EXPECT_TRUE(same_bits(train_ddp("mlp", 2, 32, 4, 1, powersgd)[0], train_ddp("mlp", 2, 32, 4, 1)[0]));
}

TEST(DistributedDataParallel, BucketsCoverTheParametersInBackwardOrder) {
  run_ranks(1, [](int, std::shared_ptr<comm::Communicator> comm) {
    auto model = nn::make_model("mlp", kSeed);
    DistributedDataParallel ddp(
        model, sgd, comm,
        {.loss = classification(), .micro_batch = 1, .bucket_bytes = 1 << 20, .first_bucket_bytes = 4096});
    const auto& buckets = ddp.buckets();
    ASSERT_GE(buckets.size(), 3u);
    EXPECT_EQ(buckets.front().params.front(), model->parameters().size() - 1);  // the last layer's bias first
    EXPECT_LE((buckets.front().end - buckets.front().begin) * 4, 4096 + 512 * 10 * 4);
    int64_t covered = 0;
    for (const GradientBucket& b : buckets) {
      EXPECT_EQ(b.begin, covered);
      covered = b.end;
    }
    EXPECT_EQ(covered, model->num_parameters());
  });
}

// A parameter forward never uses gets no gradient: it counts as zero, without an error,
// under every ZeRO stage.
TEST(DistributedDataParallel, UnusedParametersCountAsZero) {
  for (int stage : {0, 1, 2}) {
    std::vector<Weights> before(2), after(2);
    const auto errors = run_ranks(2, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
      auto model = std::make_shared<WithUnusedParameter>();
      DistributedDataParallel ddp(model,
                                  [](std::vector<Tensor> p) {
                                    return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions{.lr = 0.1});
                                  },
                                  comm, {.loss = classification(), .micro_batch = 2, .zero_stage = stage});
      before[static_cast<size_t>(rank)] = weights(*model->unused);
      const Data data = synthetic(8, 0);
      train_step(ddp, data, 0, 0);
      after[static_cast<size_t>(rank)] = weights(*model->unused);
    });
    EXPECT_EQ(errors, std::vector<std::string>(2, "")) << "stage " << stage;
    EXPECT_EQ(after[0], before[0]) << "stage " << stage;
    EXPECT_EQ(after[1], before[0]) << "stage " << stage;  // rank 0's weights, from the broadcast
  }
}

// An earlier micro-batch's gradients go straight into their leaf of the rank's subtree
// (GradientCollector): the step peaks at one copy of them above what it keeps, not two.
TEST(DistributedDataParallel, AnEarlierMicroBatchHoldsOneCopyOfItsGradients) {
  int64_t gradient_bytes = 0, extra = 0;
  const auto errors = run_ranks(1, [&](int, std::shared_ptr<comm::Communicator> comm) {
    auto model = nn::make_model("mlp", kSeed);
    for (const Tensor& p : model->parameters()) gradient_bytes += p.numel() * 4;
    DistributedDataParallel ddp(model, sgd, comm, {.loss = classification(), .micro_batch = 1});
    const Device device = model->parameters().front().device();
    const Data data = synthetic(2, 0);
    train_step(ddp, data, 0, 0);  // momentum and the reduced buffer exist from here on
    const int64_t before = memory_stats(device).allocated_bytes;
    reset_peak_memory_stats(device);
    train_step(ddp, data, 0, 1);
    extra = memory_stats(device).peak_allocated_bytes - before;
  });
  EXPECT_EQ(errors, std::vector<std::string>(1, ""));
  EXPECT_GT(extra, gradient_bytes);
  EXPECT_LT(extra, gradient_bytes * 5 / 4) << "a step of two micro-batches peaked " << extra
                                           << " bytes above what it keeps; the gradients are " << gradient_bytes;
}

TEST(DistributedDataParallel, AFailingRankStopsTheOthersNamingItself) {
  const auto errors = run_ranks(2, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    auto model = nn::make_model("mlp", kSeed);
    DistributedDataParallel ddp(model, sgd, comm, {.loss = classification(), .micro_batch = 4});
    Data data = synthetic(8, 0);
    if (rank == 1) data.labels.data<int64_t>()[5] = 10;  // rank 1's share: no class 10
    train_step(ddp, data, 0, 0);
  });
  EXPECT_NE(errors[1].find("10"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("rank 1"), std::string::npos) << errors[0];
}

// A rank that fails outside a step (a checkpoint it cannot write) gives up: the others
// learn why in their next collective, not at its timeout.
TEST(DistributedDataParallel, ARankThatGivesUpFailsTheOthersWithItsReason) {
  const auto errors = run_ranks(2, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    comm->set_timeout(std::chrono::minutes(2));
    auto model = nn::make_model("mlp", kSeed);
    DistributedDataParallel ddp(model, sgd, comm, {.loss = classification(), .micro_batch = 4});
    if (rank == 0) {
      ddp.give_up("cannot write checkpoint-3.safetensors: No space left on device");
      return;
    }
    ddp.max_over_processes(0);  // the step boundary's agreement
  });
  EXPECT_NE(errors[1].find("rank 0: cannot write checkpoint-3.safetensors"), std::string::npos) << errors[1];
}

TEST(DistributedDataParallel, LayoutsTheTreeCannotTakeAreExplained) {
  const auto errors = run_ranks(2, [&](int, std::shared_ptr<comm::Communicator> comm) {
    auto model = nn::make_model("mlp", kSeed);
    DistributedDataParallel ddp(model, sgd, comm, {.loss = classification(), .micro_batch = 4});
    const Data data = synthetic(12, 0);  // 6 per rank: 3 micro-batches of 4 in all
    train_step(ddp, data, 0, 0);
  });
  EXPECT_NE(errors[0].find("3 micro-batches, which 2 devices cannot share"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace lockstep::parallel
