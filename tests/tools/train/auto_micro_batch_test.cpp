// --micro-batch auto on hand-made model facts and machines: the largest micro-batch of the
// run's own layout that the plan says fits, for ddp and for a pipeline under each schedule
// (GPipe keeps every micro-batch's activations, 1F1B at most the stages' count), and an error
// that says what is needed when none fits. The command runs it end to end
// (TrainCommand.MicroBatchAutoPicksTheShareOnCpuDevices).
#include "tools/train/auto_micro_batch.h"

#include <gtest/gtest.h>

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

constexpr double kP = 1e5;  // parameters each device trains

// A 4-block GPT keeping 1e5 bytes per sample per block.
ModelFacts facts() {
  ModelFacts model;
  model.transformer = true;
  model.gpt = {.vocab = 256, .context = 8, .layers = 4, .heads = 4, .width = 16};
  model.parameters = 4 * static_cast<int64_t>(kP);
  model.activations = {.block_kept = 1e5};
  model.checkpointed = {.block_kept = 1e4};
  model.block = {.flops = 1e6};
  model.base = {.flops = 1e6};
  model.share = [](int, int pp, int stage) {
    return DeviceShare{
        .trained = static_cast<int64_t>(kP), .blocks = 4 / pp, .first = stage == 0, .last = stage == pp - 1};
  };
  return model;
}

MachineProfile machine(double memory_bytes) {
  MachineProfile m;
  m.devices = 2;
  m.memory_bytes = memory_bytes;
  m.fp32_flops = 1e12;
  m.bus_bandwidth = 1e10;
  m.memory_bandwidth = 1e11;
  return m;
}

TrainPlan ddp_plan(int64_t batch) {
  TrainPlan plan;
  plan.settings.strategy = "ddp";
  plan.settings.batch_size = batch;
  plan.settings.optimizer = "adamw";
  plan.replicas = 2;
  return plan;
}

TrainPlan pipeline_plan(int64_t batch, parallel::PipelineSchedule schedule) {
  TrainPlan plan = ddp_plan(batch);
  plan.settings.strategy = "mesh";
  plan.mesh.mesh = {.dp = 1, .tp = 1, .pp = 2};
  plan.mesh.schedule = schedule;
  plan.replicas = 1;
  return plan;
}

// What each micro-batch of a layout needs, from the plan itself.
double needs(const TrainPlan& plan, const LayoutChoice& layout) {
  const PlanRequest request{.batch = plan.settings.batch_size, .devices = 2, .optimizer = "adamw"};
  return predict_layout(facts(), machine(1e12), request, layout).memory.total();
}

TEST(AutoMicroBatch, TakesTheLargestThatFits) {
  const TrainPlan plan = ddp_plan(64);  // 32 samples per replica
  // Room for micro-batches of 8 but not of 16.
  const double room = (needs(plan, {.dp = 2, .micro_batch = 8}) + needs(plan, {.dp = 2, .micro_batch = 16})) / 2;
  const MicroBatchChoice choice = choose_micro_batch(plan, facts(), machine(room));
  EXPECT_EQ(choice.micro_batch, 8);
  EXPECT_DOUBLE_EQ(choice.predicted_bytes, needs(plan, {.dp = 2, .micro_batch = 8}));
  EXPECT_EQ(choose_micro_batch(plan, facts(), machine(1e12)).micro_batch, 32);  // the whole share
}

TEST(AutoMicroBatch, FollowsThePipelinesSchedule) {
  // 64 samples on 2 stages: 1F1B's first stage holds 2 micro-batches' activations, GPipe's
  // all of them (64 samples, whatever their size). Room for 1F1B's micro-batches of 8 (16
  // samples held) is room for none of GPipe's.
  const TrainPlan one_f_one_b = pipeline_plan(64, parallel::PipelineSchedule::one_f_one_b);
  const TrainPlan gpipe = pipeline_plan(64, parallel::PipelineSchedule::gpipe);
  const double room = needs(one_f_one_b, {.pp = 2, .micro_batch = 8}) * 1.01;
  EXPECT_EQ(choose_micro_batch(one_f_one_b, facts(), machine(room)).micro_batch, 8);
  EXPECT_THROW(choose_micro_batch(gpipe, facts(), machine(room)), UsageError);
}

TEST(AutoMicroBatch, NothingThatFitsSaysWhatIsNeeded) {
  try {
    choose_micro_batch(ddp_plan(64), facts(), machine(1000));
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no micro-batch of this layout fits: the smallest needs"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lockstep::tools
