// Pipeline parallelism for a user's nn::Sequential: 2 and 4 stages, both schedules, with data
// parallelism beside it, cut by the user or balanced, give one device's weights, running
// statistics, dropout masks and losses bit for bit; the gathered optimizer state is one
// device's, and a pipeline resumed from it continues with the same bits.
#include <gtest/gtest.h>

#include "lockstep/nn/activation.h"
#include "lockstep/nn/dropout.h"
#include "lockstep/nn/flatten.h"
#include "lockstep/nn/init.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/sequential.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/parallel/pipeline_parallel.h"
#include "parallel/step_testing.h"

namespace lockstep::parallel {
namespace {

using namespace step_testing;

// Flatten, Linear, BatchNorm1d, ReLU, Dropout, Linear, ReLU, Linear: 8 layers, with
// randomness and running statistics.
std::shared_ptr<nn::Sequential> make_net() {
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(784, 32), std::make_shared<nn::BatchNorm1d>(32),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Dropout>(0.2), std::make_shared<nn::Linear>(32, 32),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(32, 10)});
  nn::initialize(*net, kSeed);
  return net;
}

std::unique_ptr<optim::Optimizer> adamw(std::vector<Tensor> params) {
  return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
}

constexpr int64_t kBatch = 16, kMicro = 2;

struct Outcome {
  std::vector<std::string> state;
  std::vector<double> losses;
  NamedTensors optimizer_state;
};

Outcome run_layout(Layout& layout, int first_step, int steps) {
  Outcome run;
  for (int s = first_step; s < first_step + steps; ++s)
    run.losses.push_back(
        train_step(layout, synthetic(kBatch, static_cast<uint64_t>(s)), s * kBatch, static_cast<uint64_t>(s)).loss);
  run.state = state_bits(layout.model());
  run.optimizer_state = layout.optimizer_state();
  return run;
}

Outcome one_device(int steps) {
  DataParallel dp(
      {.loss = classification(), .devices = 1, .micro_batch = kMicro}, [](int) { return make_net(); }, adamw);
  return run_layout(dp, 0, steps);
}

SequentialPipelineOptions pipeline(int replicas, int stages, PipelineSchedule schedule,
                                   std::vector<int64_t> sizes = {}) {
  return {.input = "input",
          .loss = cross_entropy_loss_of("target"),
          .replicas = replicas,
          .stages = stages,
          .layers_per_stage = std::move(sizes),
          .schedule = schedule,
          .micro_batch = kMicro};
}

bool same_state(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const Tensor x = a[i].second.contiguous(), y = b[i].second.contiguous();
    if (a[i].first != b[i].first || x.shape() != y.shape() || x.dtype() != y.dtype() ||
        std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) != 0)
      return false;
  }
  return true;
}

TEST(SequentialPipeline, EveryCutAndScheduleGivesOneDevicesBits) {
  const Outcome one = one_device(3);
  struct Case {
    int replicas, stages;
    PipelineSchedule schedule;
    std::vector<int64_t> sizes;
  };
  const std::vector<Case> cases = {
      {1, 2, PipelineSchedule::one_f_one_b, {}},     {1, 2, PipelineSchedule::gpipe, {}},
      {1, 2, PipelineSchedule::one_f_one_b, {3, 5}}, {1, 4, PipelineSchedule::one_f_one_b, {}},
      {1, 4, PipelineSchedule::gpipe, {1, 1, 5, 1}}, {2, 2, PipelineSchedule::one_f_one_b, {}},
  };
  for (const Case& c : cases) {
    PipelineParallel pp(pipeline(c.replicas, c.stages, c.schedule, c.sizes), make_net, adamw);
    const Outcome run = run_layout(pp, 0, 3);
    const std::string name = std::to_string(c.replicas) + " x " + std::to_string(c.stages) + " " +
                             pipeline_schedule_name(c.schedule) + " cut " +
                             std::to_string(pp.rank(0).layers_per_stage()[0]);
    EXPECT_EQ(run.state, one.state) << name;
    EXPECT_EQ(run.losses, one.losses) << name;
    EXPECT_TRUE(same_state(run.optimizer_state, one.optimizer_state)) << name;
  }
}

// Passes its input on; its parameter takes no part in the forward pass.
class PassThroughWithUnused : public nn::Module {
 public:
  PassThroughWithUnused() : nn::Module("PassThroughWithUnused") {
    unused = register_parameter("unused", Tensor::from_vector<float>({0.5f, -0.25f}, {2}));
  }
  Tensor forward(const Tensor& x) override { return x; }
  void reset_parameter(const std::string&, const Tensor&, Philox&) override {}  // keeps its values
  Tensor unused;
};

Tensor both_inputs(const TensorBatch& batch) { return concat({batch["x1"], batch["x2"]}, 1); }

// Linear(9, 16), ReLU, a pass-through with an unused parameter, Linear(16, 2).
std::shared_ptr<nn::Sequential> make_regression() {
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(9, 16), std::make_shared<nn::ReLU>(), std::make_shared<PassThroughWithUnused>(),
      std::make_shared<nn::Linear>(16, 2)});
  nn::initialize(*net, kSeed);
  return net;
}

// A two-input model with an MSE loss and an unused parameter, in 2 stages (its first stage's
// input made from both fields), ends with one device's bits; the unused parameter is as it was.
TEST(SequentialPipeline, ATwoInputMseModelWithAnUnusedParameterGivesOneDevicesBits) {
  const LossFunction mse = [](nn::Module& model, const TensorBatch& batch, const StepContext&) {
    return square(model(both_inputs(batch)) - batch["y"]);
  };
  const auto train = [](Layout& layout) {
    for (int s = 0; s < 3; ++s)
      layout.step(two_input_batch(kBatch, 3000 + static_cast<uint64_t>(s)),
                  {.seed = kSeed, .step = static_cast<uint64_t>(s), .first_sample = s * kBatch});
    return state_bits(layout.model());
  };
  // Without weight decay, which (as under DataParallel, whose bits these are) reaches a
  // parameter with a zero gradient too.
  const OptimizerFactory adam = [](std::vector<Tensor> params) {
    return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0});
  };
  DataParallel one(
      {.loss = mse, .devices = 1, .micro_batch = kMicro}, [](int) { return make_regression(); }, adam);
  const std::vector<std::string> expected = train(one);
  EXPECT_NE(expected, state_bits(*make_regression())) << "training changed nothing";
  for (const PipelineSchedule schedule : {PipelineSchedule::one_f_one_b, PipelineSchedule::gpipe}) {
    PipelineParallel pp({.make_input = both_inputs,
                         .loss = squared_error_of("y"),
                         .stages = 2,
                         .layers_per_stage = {2, 2},
                         .schedule = schedule,
                         .micro_batch = kMicro},
                        make_regression, adam);
    EXPECT_EQ(train(pp), expected) << pipeline_schedule_name(schedule);
    const auto& unused = static_cast<PassThroughWithUnused&>(*static_cast<nn::Sequential&>(pp.model())[2]).unused;
    EXPECT_EQ(unused.to_vector<float>(), (std::vector<float>{0.5f, -0.25f}));
  }
}

TEST(SequentialPipeline, AResumedPipelineContinuesWithTheSameBits) {
  const Outcome straight = one_device(4);
  PipelineParallel first(pipeline(1, 2, PipelineSchedule::one_f_one_b), make_net, adamw);
  run_layout(first, 0, 2);
  const NamedTensors weights = first.model().state_dict();
  const NamedTensors optimizer_state = first.optimizer_state();
  // Resumed on another layout: 2 replicas of 2 stages.
  PipelineParallel resumed(pipeline(2, 2, PipelineSchedule::gpipe), make_net, adamw);
  resumed.load_model_state(weights);
  resumed.load_optimizer_state(optimizer_state);
  const Outcome rest = run_layout(resumed, 2, 2);
  EXPECT_EQ(rest.state, straight.state);
  EXPECT_EQ(rest.losses, std::vector<double>(straight.losses.begin() + 2, straight.losses.end()));
}

TEST(SequentialPipeline, BalancedStagesEvenOutTheParameters) {
  // 784*32+32 = 25120 in layer 1, 32*32+32 = 1056 in layer 5, 330 in layer 7, 64 in the norm.
  PipelineParallel pp(pipeline(1, 2, PipelineSchedule::one_f_one_b), make_net, adamw);
  EXPECT_EQ(pp.rank(0).layers_per_stage(), (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(balance_layers({10, 1, 1, 10}, 2), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(balance_layers({1, 1, 1}, 3), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(balance_layers({5, 0, 0, 5}, 2), (std::vector<int64_t>{3, 1}));  // ties: the earlier stage
}

TEST(SequentialPipeline, BadLayoutsAreErrorsThatSayWhatSumsToWhat) {
  try {
    PipelineParallel pp(pipeline(1, 2, PipelineSchedule::one_f_one_b, {3, 3}), make_net, adamw);
    ADD_FAILURE() << "a cut of 6 layers was taken for 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holding 6 layer(s); the Sequential has 8 layers in 2 pipeline stages"),
              std::string::npos)
        << e.what();
  }
  SequentialPipelineOptions no_loss = pipeline(1, 2, PipelineSchedule::gpipe);
  no_loss.loss = nullptr;
  EXPECT_THROW(PipelineParallel(no_loss, make_net, adamw), Error);
  EXPECT_THROW(PipelineParallel(pipeline(1, 9, PipelineSchedule::gpipe), make_net, adamw), Error);
}

// A stage whose loss throws stops the others at once: stage 0 waits for its gradients in
// the pipeline group, which the failing rank's abort reaches through its world group (it
// hung before abort went to split groups).
TEST(SequentialPipeline, AFailingStageStopsTheOthersAtOnce) {
  SequentialPipelineOptions options = pipeline(1, 2, PipelineSchedule::one_f_one_b);
  options.loss = [](const Tensor&, const TensorBatch&, const StepContext&) -> Tensor {
    throw Error("the targets are bad");
  };
  PipelineParallel pp(options, make_net, adamw);
  try {
    train_step(pp, synthetic(kBatch, 0), 0, 0);
    ADD_FAILURE() << "the step went through";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the targets are bad"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::parallel
