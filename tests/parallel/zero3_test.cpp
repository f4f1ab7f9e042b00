// ZeRO-3 (FSDP) under distributed data parallelism, ranks as threads: the weights are
// sharded too, and each unit module is gathered for its forward and its backward. It gives
// one device's bits for the MLP and CNN (the root's children as units) and the GPT (its
// blocks as units, with and without activation checkpointing), and a parameter used outside
// its unit fails with an error that says what to do. zero_test.cpp covers its checkpoint
// state, resumes and memory beside the other stages.
#include <gtest/gtest.h>

#include "lockstep/nn/gpt.h"
#include "lockstep/nn/linear.h"
#include "lockstep/parallel/distributed_data_parallel.h"
#include "parallel/ddp_testing.h"
#include "parallel/rank_threads.h"
#include "parallel/step_testing.h"

namespace lockstep::parallel {
namespace {

using namespace step_testing;
using namespace ddp_testing;
using rank_threads::run_ranks;

// 32 samples in micro-batches of 4 are 2 per rank on 4 ranks (the units gathered and
// released for each), of 8 one per rank.
TEST(Zero3, GivesOneDevicesBits) {
  for (const auto& [name, make_optimizer] : {std::pair<const char*, OptimizerFactory>{"sgd", sgd},
                                             std::pair<const char*, OptimizerFactory>{"adamw", adamw}}) {
    for (int64_t micro : {4, 8}) {
      const Weights one = train_dp("mlp", 1, 32, micro, 2, make_optimizer);
      for (int ranks : {1, 2, 4}) {
        const auto sharded = train_ddp("mlp", ranks, 32, micro, 2, {.zero_stage = 3}, make_optimizer);
        for (int r = 0; r < ranks; ++r)
          EXPECT_TRUE(same_bits(sharded[static_cast<size_t>(r)], one))
              << name << ", micro-batch " << micro << ", " << ranks << " ranks, rank " << r;
      }
    }
  }
  EXPECT_TRUE(
      same_bits(train_ddp("cnn", 4, 16, 4, 2, {.zero_stage = 3}, adamw)[3], train_dp("cnn", 1, 16, 4, 2, adamw)));
}

constexpr int64_t kGptBatch = 8;

// Three steps of a three-block GPT on `ranks` ranks; rank 0's state_dict.
std::vector<std::string> train_gpt(int ranks, int zero_stage, bool checkpoint_activations) {
  const nn::GptConfig config{.vocab = 64, .context = 8, .layers = 3, .heads = 2, .width = 16};
  std::vector<std::string> bits;
  const auto errors = run_ranks(ranks, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    auto model = std::make_shared<nn::Gpt>(config, kSeed);
    model->checkpoint_activations = checkpoint_activations;
    DistributedDataParallel ddp(model, adamw, comm,
                                {.loss = next_token_loss("input", "target"),
                                 .micro_batch = 2,
                                 .zero_stage = zero_stage,
                                 .zero3_unit_types = {"GptBlock"}});
    for (uint64_t s = 0; s < 3; ++s) {
      Philox rng(kSeed, 700 + s);
      std::vector<int64_t> tokens(static_cast<size_t>(kGptBatch * config.context)), targets(tokens.size());
      for (int64_t& t : tokens) t = rng.next_u32() % config.vocab;
      for (int64_t& t : targets) t = rng.next_u32() % config.vocab;
      ddp.step({{"input", Tensor::from_vector(tokens, {kGptBatch, config.context})},
                {"target", Tensor::from_vector(targets, {kGptBatch, config.context})}},
               {.seed = kSeed, .step = s, .first_sample = static_cast<int64_t>(s) * kGptBatch});
    }
    const std::vector<std::string> state = state_bits(ddp.model());
    if (rank == 0) bits = state;
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  return bits;
}

// The blocks are gathered one at a time; the embeddings, tied to the head, stay gathered for
// the step. Checkpointing runs each block's forward again inside backward.
TEST(Zero3, GptBlocksAsUnitsKeepTheBits) {
  for (bool checkpointed : {false, true}) {
    const std::vector<std::string> one = train_gpt(1, 0, checkpointed);
    ASSERT_FALSE(one.empty());
    for (int ranks : {2, 4}) EXPECT_EQ(train_gpt(ranks, 3, checkpointed), one) << ranks << " ranks" << checkpointed;
  }
}

// The first error of any rank.
std::string first_error(const std::vector<std::string>& errors) {
  for (const std::string& e : errors)
    if (!e.empty()) return e;
  return "";
}

// With the root's children as units, the GPT's head reads the embedding's weight in the
// model's own forward, after the embedding's unit has been released.
TEST(Zero3, AParameterUsedOutsideItsUnitIsNamed) {
  const auto errors = run_ranks(2, [&](int, std::shared_ptr<comm::Communicator> comm) {
    const nn::GptConfig config{.vocab = 64, .context = 8, .layers = 2, .heads = 2, .width = 16};
    DistributedDataParallel ddp(std::make_shared<nn::Gpt>(config, kSeed), adamw, comm,
                                {.loss = next_token_loss("input", "target"), .zero_stage = 3});
    const Tensor tokens = Tensor::zeros({2, 8}, DType::i64);
    ddp.step({{"input", tokens}, {"target", tokens}}, {});
  });
  const std::string error = first_error(errors);
  EXPECT_NE(error.find("sharded by ZeRO-3"), std::string::npos) << error;
  EXPECT_NE(error.find("zero3_unit_types"), std::string::npos) << error;
}

// A module that calls its child's forward() directly bypasses the child's hooks.
class CallsForwardDirectly final : public nn::Module {
 public:
  CallsForwardDirectly() : Module("CallsForwardDirectly") {
    inner = register_module("inner", std::make_shared<nn::Linear>(784, 10));
  }
  Tensor forward(const Tensor& x) override { return inner->forward(reshape(x, {x.size(0), 784})); }
  std::shared_ptr<nn::Linear> inner;
};

TEST(Zero3, ACallPastTheHooksIsNamed) {
  const auto errors = run_ranks(2, [&](int, std::shared_ptr<comm::Communicator> comm) {
    auto model = std::make_shared<CallsForwardDirectly>();
    DistributedDataParallel ddp(model, sgd, comm, {.loss = classification(), .micro_batch = 4, .zero_stage = 3});
    train_step(ddp, synthetic(8, 0), 0, 0);
  });
  const std::string error = first_error(errors);
  EXPECT_NE(error.find("module(x), not module.forward(x)"), std::string::npos) << error;
}

TEST(Zero3, UnitTypesTheModelLacksAreNamed) {
  const auto errors = run_ranks(1, [&](int, std::shared_ptr<comm::Communicator> comm) {
    DistributedDataParallel ddp(nn::make_model("mlp", kSeed), sgd, comm,
                                {.loss = classification(), .zero_stage = 3, .zero3_unit_types = {"GptBlock"}});
  });
  EXPECT_NE(errors[0].find("no module of the model has a unit type given (GptBlock)"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace lockstep::parallel
