// The plan's arithmetic on hand-made model facts and machines: which layouts it offers, each
// memory term against the formula written out here, the pipeline's micro-batches in flight,
// what CPU devices share, what does not fit and why, and the ranking.
#include "tools/plan/layout_prediction.h"

#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

constexpr double kP = 1e6;  // parameters of every device's share in these facts

// A 12-block GPT whose every device trains kP parameters and keeps, per sample, 10 bytes
// per block, 100 for the head and 1000 while backward runs.
ModelFacts transformer_facts() {
  ModelFacts facts;
  facts.transformer = true;
  facts.gpt = {.vocab = 256, .context = 8, .layers = 12, .heads = 12, .width = 48};
  facts.parameters = 12 * static_cast<int64_t>(kP);
  facts.zero3_gathered = static_cast<int64_t>(kP) / 8;
  facts.activations = {
      .block_kept = 10, .rest_kept = 100, .first_kept = 0, .last_transient = 1000, .other_transient = 1000};
  facts.checkpointed = {
      .block_kept = 1, .rest_kept = 100, .first_kept = 0, .last_transient = 1000, .other_transient = 1000};
  facts.block = {.seconds = 0, .flops = 1e9};
  facts.base = {.seconds = 0, .flops = 1e9};
  facts.share = [](int tp, int pp, int stage) {
    return DeviceShare{
        .trained = static_cast<int64_t>(kP), .blocks = 12 / pp, .first = stage == 0, .last = stage == pp - 1 && tp > 0};
  };
  return facts;
}

MachineProfile gpus(double memory_bytes = 1e12) {
  MachineProfile machine;
  machine.devices = 8;
  machine.memory_bytes = memory_bytes;
  machine.fp32_flops = 1e12;
  machine.bus_bandwidth = 1e10;
  machine.memory_bandwidth = 1e12;
  return machine;
}

LayoutPrediction predict(const LayoutChoice& layout, int64_t batch, const MachineProfile& machine = gpus(),
                         const std::string& optimizer = "adamw") {
  const PlanRequest request{.batch = batch, .devices = layout.dp * layout.tp * layout.pp, .optimizer = optimizer};
  return predict_layout(transformer_facts(), machine, request, layout);
}

TEST(LayoutPrediction, OffersEveryMeshTheModelCutsInto) {
  const PlanRequest request{.batch = 64, .devices = 8, .micro_batch = 8};
  std::set<std::tuple<int, int, int, int, bool>> shapes;  // dp, tp, pp, zero, gpipe
  for (const LayoutChoice& l : candidate_layouts(transformer_facts(), request)) {
    EXPECT_EQ(l.dp * l.tp * l.pp, 8) << l.name();
    EXPECT_EQ(l.micro_batch, 8);
    shapes.insert({l.dp, l.tp, l.pp, l.zero, l.schedule == parallel::PipelineSchedule::gpipe});
  }
  // tp divides the 12 heads and the 256 tokens: 1, 2, 4 (not 8); pp any of 1, 2, 4, 8 with
  // dp the rest, as long as dp's share of 64 holds micro-batches of 8. ZeRO 1-3 under ddp,
  // ZeRO-1 on a mesh of several replicas.
  std::set<std::tuple<int, int, int, int, bool>> expected;
  for (int tp : {1, 2, 4}) {
    for (int pp : {1, 2, 4, 8}) {
      if (8 % (tp * pp) != 0) continue;
      const int dp = 8 / (tp * pp);
      if (64 / dp % 8 != 0) continue;
      const std::vector<int> zeros = dp == 1              ? std::vector<int>{0}
                                     : tp == 1 && pp == 1 ? std::vector<int>{0, 1, 2, 3}
                                                          : std::vector<int>{0, 1};
      for (int zero : zeros) {
        for (bool gpipe : pp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
          expected.insert({dp, tp, pp, zero, gpipe});
        }
      }
    }
  }
  EXPECT_EQ(shapes, expected);
}

TEST(LayoutPrediction, ABatchNoLayoutSplitsIsAUsageError) {
  const PlanRequest request{.batch = 6, .devices = 4, .micro_batch = 4};
  try {
    candidate_layouts(transformer_facts(), request);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("batch of 6 over 4 devices"), std::string::npos) << e.what();
  }
}

TEST(LayoutPrediction, DataParallelMemoryFollowsEachStagesFormula) {
  // dp 4, one micro-batch per replica: the step's buffer and nothing else under ddp; ZeRO-1
  // shards AdamW's 8 bytes and adds the reduced shard; ZeRO-2 keeps only the shard and two
  // buckets (4 MB of gradients is less than five 25 MiB buckets: all of it).
  const LayoutPrediction ddp = predict({.dp = 4, .micro_batch = 2}, 8);
  EXPECT_DOUBLE_EQ(ddp.memory.parameters, 4 * kP);
  EXPECT_DOUBLE_EQ(ddp.memory.optimizer, 8 * kP);
  EXPECT_DOUBLE_EQ(ddp.memory.gradients, 4 * kP);
  const LayoutPrediction zero1 = predict({.dp = 4, .zero = 1, .micro_batch = 2}, 8);
  EXPECT_DOUBLE_EQ(zero1.memory.optimizer, 2 * kP);
  EXPECT_DOUBLE_EQ(zero1.memory.gradients, 4 * kP + kP);
  const LayoutPrediction zero2 = predict({.dp = 4, .zero = 2, .micro_batch = 2}, 8);
  EXPECT_DOUBLE_EQ(zero2.memory.optimizer, 2 * kP);
  EXPECT_DOUBLE_EQ(zero2.memory.gradients, kP + 4 * kP);
  // ZeRO-3: a quarter of the weights and the units gathered (an eighth of them here), the
  // rest as ZeRO-2.
  const LayoutPrediction zero3 = predict({.dp = 4, .zero = 3, .micro_batch = 2}, 8);
  EXPECT_DOUBLE_EQ(zero3.memory.parameters, kP + kP / 2);
  EXPECT_DOUBLE_EQ(zero3.memory.optimizer, 2 * kP);
  EXPECT_DOUBLE_EQ(zero3.memory.gradients, kP + 4 * kP);
  EXPECT_GT(zero3.time.communication, zero2.time.communication);
  // Activations: one micro-batch of 2 samples, 12 blocks of 10 bytes and the head's 100
  // kept, 1000 while backward runs.
  EXPECT_DOUBLE_EQ(ddp.memory.activations, 2 * (12 * 10 + 100 + 1000));
}

TEST(LayoutPrediction, AccumulationHoldsTheTreesPartialSums) {
  // 4 micro-batches per replica: the tree holds two sums (after leaves 0-2, binary 11)
  // while the last is computed, or one sum and an earlier leaf: two copies beside the step's
  // buffer under ddp; the mesh keeps every leaf and its sums (three at most, beside none).
  const LayoutPrediction ddp = predict({.dp = 2, .micro_batch = 1}, 8);
  EXPECT_DOUBLE_EQ(ddp.memory.gradients, 4 * kP + 2 * 4 * kP);
  const LayoutPrediction one = predict({.micro_batch = 2}, 8);
  EXPECT_DOUBLE_EQ(one.memory.gradients, 4 * kP * (1 + 2));
  // Eight: popcount(7) = 3 sums while the last runs.
  const LayoutPrediction eight = predict({.dp = 2, .micro_batch = 1}, 16);
  EXPECT_DOUBLE_EQ(eight.memory.gradients, 4 * kP + 3 * 4 * kP);
}

TEST(LayoutPrediction, PipelineStagesHoldTheirSchedulesMicroBatches) {
  // pp 4 with 8 micro-batches of 1: GPipe holds all 8 on every stage, 1F1B 4 - stage.
  const LayoutPrediction gpipe = predict({.pp = 4, .schedule = parallel::PipelineSchedule::gpipe, .micro_batch = 1}, 8);
  const LayoutPrediction one_f_one_b = predict({.pp = 4, .micro_batch = 1}, 8);
  ASSERT_EQ(gpipe.stage_memory.size(), 4u);
  const double fixed = 4 * kP + 8 * kP + 4 * kP * (1 + 3);  // weights, AdamW, gradients of 8 leaves
  for (int stage = 0; stage < 4; ++stage) {
    const double kept = 3 * 10 + (stage == 3 ? 100 : 0);  // 3 blocks; the head on the last stage
    EXPECT_DOUBLE_EQ(gpipe.stage_memory[stage], fixed + 8 * kept + 1000) << stage;
    EXPECT_DOUBLE_EQ(one_f_one_b.stage_memory[stage], fixed + (4 - stage) * kept + 1000) << stage;
  }
  EXPECT_EQ(gpipe.largest_stage, 3);
  EXPECT_DOUBLE_EQ(gpipe.memory.total(), gpipe.stage_memory[3]);
  // The bubble: (P - 1) micro-batch times of the slowest stage.
  EXPECT_NEAR(one_f_one_b.time.bubble, 3 * one_f_one_b.time.compute / 8, 1e-12);
}

TEST(LayoutPrediction, CheckpointingKeepsEachBlocksInputOnly) {
  const LayoutPrediction kept = predict({.micro_batch = 4}, 4);
  const LayoutPrediction checkpointed = predict({.micro_batch = 4, .checkpoint_activations = true}, 4);
  EXPECT_DOUBLE_EQ(kept.memory.activations, 4 * (12 * 10 + 100 + 1000));
  EXPECT_DOUBLE_EQ(checkpointed.memory.activations, 4 * (12 * 1 + 100 + 1000));
  // One more forward of every block.
  EXPECT_GT(checkpointed.time.compute, kept.time.compute);
}

TEST(LayoutPrediction, CpuDevicesShareTheSteppedStateOncePerHost) {
  MachineProfile host = gpus();
  host.cpu_devices = true;
  host.devices = 2;
  const LayoutPrediction ddp = predict({.dp = 2, .micro_batch = 2}, 4, host);
  EXPECT_DOUBLE_EQ(ddp.memory.optimizer, 0);
  EXPECT_DOUBLE_EQ(ddp.memory.gradients, 0);  // one micro-batch: its gradients are the shared buffer
  EXPECT_DOUBLE_EQ(ddp.host_shared_bytes, (4 + 8 + 4) * kP);
  // The mesh's devices keep their own.
  const LayoutPrediction tp = predict({.tp = 2, .micro_batch = 4}, 4, host);
  EXPECT_DOUBLE_EQ(tp.memory.optimizer, 8 * kP);
  EXPECT_DOUBLE_EQ(tp.host_shared_bytes, 0);
}

TEST(LayoutPrediction, WhatDoesNotFitSaysWhatItNeeds) {
  const LayoutPrediction p = predict({.dp = 8, .micro_batch = 1}, 8, gpus(10e6));
  EXPECT_FALSE(p.fits);
  EXPECT_NE(p.why_not.find("needs 15.3 MiB on each device, which has 9.5 MiB"), std::string::npos) << p.why_not;
  // No bf16 units: the layout cannot run, whatever its memory.
  const PlanRequest request{.batch = 8, .devices = 8, .precision = "bf16"};
  const LayoutPrediction bf16 =
      predict_layout(transformer_facts(), gpus(), request, {.dp = 8, .micro_batch = 1, .precision = "bf16"});
  EXPECT_FALSE(bf16.fits);
  EXPECT_NE(bf16.why_not.find("no bf16"), std::string::npos) << bf16.why_not;
}

TEST(LayoutPrediction, FittingLayoutsComeFirstFastestFirst) {
  // 16 MB per device: AdamW's fp32 state of 1M parameters (16 MB) with anything beside it
  // does not fit unless ZeRO shards it.
  const PlanRequest request{.batch = 8, .devices = 8, .micro_batch = 1};
  const std::vector<LayoutPrediction> plan = plan_layouts(transformer_facts(), gpus(16e6), request);
  ASSERT_FALSE(plan.empty());
  bool seen_unfit = false;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!plan[i].fits) {
      seen_unfit = true;
      EXPECT_FALSE(plan[i].why_not.empty());
      if (i > 0 && !plan[i - 1].fits) {
        EXPECT_LE(plan[i - 1].memory.total(), plan[i].memory.total());
      }
      continue;
    }
    EXPECT_FALSE(seen_unfit) << "a fitting layout after one that does not: " << plan[i].layout.name();
    EXPECT_LE(plan[i].memory.total() + plan[i].host_shared_bytes / 8, 16e6);
    if (i > 0) {
      EXPECT_GE(plan[i - 1].samples_per_second, plan[i].samples_per_second * 0.99);
    }
  }
  EXPECT_TRUE(plan.front().fits);
  EXPECT_TRUE(seen_unfit);
}

TEST(LayoutPrediction, TrainFlagsRunTheLayout) {
  EXPECT_EQ(LayoutChoice({.dp = 2, .tp = 2, .pp = 2, .micro_batch = 4}).train_flags(),
            "--strategy mesh --dp 2 --tp 2 --pp 2 --schedule 1f1b --micro-batch 4");
  const LayoutChoice zero2{.dp = 8, .zero = 2, .micro_batch = 16, .checkpoint_activations = true, .precision = "bf16"};
  EXPECT_EQ(zero2.train_flags(), "--strategy zero2 --micro-batch 16 --checkpoint-activations --precision bf16");
  EXPECT_EQ(zero2.launcher(), "lockstep run -n 8 -- ");
  EXPECT_EQ(LayoutChoice({.pp = 2, .micro_batch = 1}).launcher(), "");
  EXPECT_EQ(LayoutChoice({.dp = 2, .pp = 2, .zero = 1, .micro_batch = 1}).train_flags(),
            "--strategy zero1 --dp 2 --tp 1 --pp 2 --schedule 1f1b --micro-batch 1");
}

}  // namespace
}  // namespace lockstep::tools
