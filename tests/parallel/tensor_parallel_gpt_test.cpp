// A GPT block cut by heads and MLP columns over 1, 2 and 4 ranks against the unsplit block:
// the same output on every rank, the replicated layer norms' full gradients, and each
// rank's slice of the attention and MLP gradients.
#include "lockstep/parallel/tensor_parallel_gpt.h"

#include <gtest/gtest.h>

#include "lockstep/comm/local_communicator.h"
#include "lockstep/ops/ops.h"
#include "lockstep/parallel/gpt_stage.h"
#include "parallel/rank_threads.h"
#include "testing/gradcheck.h"

namespace lockstep::parallel {
namespace {

// Attention and the MLP each sum partial products across ranks: a little more rounding.
constexpr double kTolerance = 2e-5;

using namespace rank_threads;
using testing::random_f32;

// Rows [r·n/T, (r+1)·n/T) of each of q, k and v (n = rows / 3).
Tensor qkv_rows(const Tensor& full, int rank, int ranks) {
  const int64_t n = full.size(0) / 3, size = n / ranks;
  std::vector<Tensor> parts;
  for (int64_t p = 0; p < 3; ++p) parts.push_back(slice(full, 0, p * n + rank * size, p * n + (rank + 1) * size));
  return concat(parts, 0);
}

void check_block(int ranks) {
  const nn::Gpt gpt(nn::GptConfig{.vocab = 256, .context = 8, .layers = 1, .heads = 4, .width = 16}, 7);
  nn::GptBlock& full = *gpt.h[0];
  const Tensor input = random_f32({2, 8, 16}, 1);
  const Tensor projection = random_f32({2, 8, 16}, 2);
  const Tensor x = input.clone().set_requires_grad(true);
  const Tensor y = full.forward(x);
  sum(y * projection).backward();

  expect_no_errors(run_ranks(ranks, [&](int r, const std::shared_ptr<comm::Communicator>& group) {
    TensorParallelGptBlock block(full, 4, group);
    const Tensor xr = input.clone().set_requires_grad(true);
    const Tensor yr = block.forward(xr);
    sum(yr * projection).backward();
    const std::string on = " on rank " + std::to_string(r) + " of " + std::to_string(ranks);
    EXPECT_EQ(block.local_heads, 4 / ranks);
    expect_close(yr, y, "output" + on, kTolerance);
    expect_close(xr.grad(), x.grad(), "input gradient" + on, kTolerance);
    expect_close(block.ln_1->weight.grad(), full.ln_1->weight.grad(), "ln_1 gradient" + on, kTolerance);
    expect_close(block.ln_2->bias.grad(), full.ln_2->bias.grad(), "ln_2 gradient" + on, kTolerance);
    expect_close(block.attn_qkv->weight.grad(), qkv_rows(full.attn->c_attn->weight.grad(), r, ranks),
                 "c_attn gradient" + on, kTolerance);
    const int64_t width = 16 / ranks, hidden = 64 / ranks;
    expect_close(block.attn_proj->weight.grad(), slice(full.attn->c_proj->weight.grad(), 1, r * width, (r + 1) * width),
                 "attn c_proj gradient" + on, kTolerance);
    expect_close(block.mlp_fc->weight.grad(), slice(full.mlp->c_fc->weight.grad(), 0, r * hidden, (r + 1) * hidden),
                 "c_fc gradient" + on, kTolerance);
  }));
}

TEST(TensorParallelGpt, BlockMatchesTheUnsplitBlockOn1Rank) { check_block(1); }
TEST(TensorParallelGpt, BlockMatchesTheUnsplitBlockOn2Ranks) { check_block(2); }
TEST(TensorParallelGpt, BlockMatchesTheUnsplitBlockOn4Ranks) { check_block(4); }

TEST(TensorParallelGpt, HeadsTheGroupDoesNotDivideAreAnError) {
  const nn::Gpt gpt(nn::GptConfig{.vocab = 256, .context = 8, .layers = 1, .heads = 4, .width = 24}, 7);
  const auto comms = comm::LocalCommunicator::create_group(3);
  try {
    TensorParallelGptBlock block(*gpt.h[0], 4, comms[0]);
    FAIL() << "4 heads cannot go to 3 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 heads do not go to 3 ranks"), std::string::npos) << e.what();
  }
}

// The whole model as one stage, vocabulary cut too: the same loss on every rank, and each
// rank's rows of the (tied) token embedding's gradient.
void check_model(int ranks) {
  const nn::GptConfig config{.vocab = 256, .context = 8, .layers = 2, .heads = 4, .width = 16};
  nn::Gpt full(config, 11);
  std::vector<int64_t> values(2 * 8);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int64_t>((i * 37 + 5) % 256);
  const Tensor tokens = Tensor::from_vector(values, {2, 8});
  const Tensor targets = Tensor::from_vector(std::vector<int64_t>(values.rbegin(), values.rend()), {2, 8});
  const Tensor expected = nn::gpt_loss(full.forward(tokens), targets);
  expected.backward();
  expect_no_errors(run_ranks(ranks, [&](int r, const std::shared_ptr<comm::Communicator>& group) {
    GptStage model(full, {.stage = 0, .stages = 1, .first_block = 0, .end_block = 2}, group);
    const Tensor loss = model.loss_sum(model.forward(tokens), targets) * (1.0 / static_cast<double>(targets.numel()));
    loss.backward();
    const auto gradient = [&](const std::string& name) {
      for (const auto& [key, parameter] : model.named_parameters())
        if (key == name) return parameter.grad();
      return Tensor();
    };
    const std::string on = " on rank " + std::to_string(r) + " of " + std::to_string(ranks);
    expect_close(loss, expected, "loss" + on, kTolerance);
    const int64_t rows = 256 / ranks;
    expect_close(gradient("wte.weight"), slice(full.wte->weight.grad(), 0, r * rows, (r + 1) * rows),
                 "wte gradient" + on, kTolerance);
    expect_close(gradient("wpe.weight"), full.wpe->weight.grad(), "wpe gradient" + on, kTolerance);
    expect_close(gradient("ln_f.weight"), full.ln_f->weight.grad(), "ln_f gradient" + on, kTolerance);
  }));
}

TEST(TensorParallelGpt, WholeModelMatchesTheUnsplitModelOn1Rank) { check_model(1); }
TEST(TensorParallelGpt, WholeModelMatchesTheUnsplitModelOn2Ranks) { check_model(2); }
TEST(TensorParallelGpt, WholeModelMatchesTheUnsplitModelOn4Ranks) { check_model(4); }

}  // namespace
}  // namespace lockstep::parallel
