// f16's loss scaler under ZeRO (sharded_loss_scaling.h): each rank unscales its shard of the
// reduced gradients and every rank steps or skips alike. Ranks as threads over one local group
// of CPU tensors (the gate needs no GPU); the expected weights are a plain loop's.
#include "lockstep/parallel/sharded_loss_scaling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "lockstep/optim/sgd.h"
#include "parallel/rank_threads.h"

namespace lockstep::parallel {
namespace {

using rank_threads::expect_no_errors;
using rank_threads::run_ranks;

constexpr double kLr = 0.5;
constexpr int kRanks = 2;

std::vector<float> start_weights(int64_t n) {
  std::vector<float> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) w[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i) - 1.0f;
  return w;
}

// Rank r's unscaled gradient of element i of the flat buffer.
float gradient(int r, int64_t i) { return 0.125f * static_cast<float>((i + 1) * (r + 1)); }

struct Outcome {
  std::vector<float> weights;
  double scale = 0;
  bool skipped = false;
};

// One sharded SGD step over parameters of 5 and 7 elements from every rank's gradients
// scaled by `scale`, element `poisoned` of rank 1's made inf (none when negative).
std::vector<Outcome> sharded_step(double scale, int64_t poisoned) {
  std::vector<Outcome> outcomes(kRanks);
  expect_no_errors(run_ranks(kRanks, [&](int r, const std::shared_ptr<comm::Communicator>& comm) {
    const std::vector<float> w = start_weights(12);
    std::vector<Tensor> params{Tensor::from_vector(std::vector<float>(w.begin(), w.begin() + 5), {5}),
                               Tensor::from_vector(std::vector<float>(w.begin() + 5, w.end()), {7})};
    for (Tensor& p : params) p.set_requires_grad(true);
    const FlatGradients layout(params, kRanks);
    ShardedOptimizer sharded(
        layout, *comm,
        [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions{.lr = kLr}); },
        /*share_weights=*/false);
    optim::LossScaler scaler({.init_scale = scale});
    const Tensor flat = layout.empty_buffer();
    flat.zero();
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<float> g(static_cast<size_t>(params[i].numel()));
      for (size_t e = 0; e < g.size(); ++e)
        g[e] = static_cast<float>(scale) * gradient(r, (i == 0 ? 0 : 5) + static_cast<int64_t>(e));
      if (r == 1 && poisoned >= 0 && (i == 0 ? poisoned < 5 : poisoned >= 5))
        g[static_cast<size_t>(i == 0 ? poisoned : poisoned - 5)] = std::numeric_limits<float>::infinity();
      layout.view(flat, i).copy_from(Tensor::from_vector(g, params[i].shape()));
    }
    DeviceTimes times;
    Outcome& out = outcomes[static_cast<size_t>(r)];
    sharded.step(flat, times, Tensor(), loss_scaled_gate(scaler, *comm, &out.skipped));
    for (const Tensor& p : params)
      for (const float v : p.to_vector<float>()) out.weights.push_back(v);
    out.scale = scaler.scale();
  }));
  return outcomes;
}

TEST(ShardedLossScaling, EveryRankStepsTheUnscaledSum) {
  const std::vector<float> w = start_weights(12);
  for (const Outcome& out : sharded_step(1024.0, -1)) {
    EXPECT_FALSE(out.skipped);
    EXPECT_EQ(out.scale, 1024.0);  // one finite step: no growth yet
    for (int64_t i = 0; i < 12; ++i) {
      const double sum = static_cast<double>(gradient(0, i)) + gradient(1, i);
      EXPECT_NEAR(out.weights[static_cast<size_t>(i)], w[static_cast<size_t>(i)] - kLr * sum, 1e-6) << i;
    }
  }
}

// The inf lies in one rank's shard only (element 1 is in rank 0's half of the buffer, element
// 10 in rank 1's): both ranks skip, keep their weights, and halve the scale.
TEST(ShardedLossScaling, AnOverflowInOneShardSkipsEveryRank) {
  const std::vector<float> w = start_weights(12);
  for (const int64_t poisoned : {int64_t{1}, int64_t{10}}) {
    const std::vector<Outcome> outcomes = sharded_step(1024.0, poisoned);
    for (size_t r = 0; r < outcomes.size(); ++r) {
      EXPECT_TRUE(outcomes[r].skipped) << "rank " << r << ", inf at " << poisoned;
      EXPECT_EQ(outcomes[r].scale, 512.0) << "rank " << r;
      EXPECT_EQ(outcomes[r].weights, w) << "rank " << r << " changed its weights";
    }
  }
}

}  // namespace
}  // namespace lockstep::parallel
