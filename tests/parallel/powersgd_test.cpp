// PowerSGD against the algorithm written out in double precision: one step's P, Q and error
// feedback; a sum of low rank recovered whole; vectors summed exactly; every rank the same
// bits; its state carried to a new object continues the same.
#include "lockstep/parallel/powersgd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "lockstep/core/philox.h"
#include "parallel/rank_threads.h"

namespace lockstep::parallel {
namespace {

using rank_threads::run_ranks;

constexpr int64_t kRows = 24, kCols = 40;

// A weight matrix (compressed) and a bias (sent whole), as a layer holds them.
FlatGradients layer_layout() { return FlatGradients({Tensor::zeros({kRows, kCols}), Tensor::zeros({kRows})}); }

// Rank r's gradient over the flat layout, from Philox(r).
std::vector<float> gradient_of(int rank, int64_t numel) {
  Philox random(11, static_cast<uint64_t>(rank));
  std::vector<float> g(static_cast<size_t>(numel));
  for (float& v : g) v = static_cast<float>(random.next_normal());
  return g;
}

using Matrix = std::vector<double>;  // row-major

// Gram-Schmidt on the columns of p (n x r), in double.
void orthonormalize(Matrix& p, int64_t n, int r) {
  for (int j = 0; j < r; ++j) {
    for (int k = 0; k < j; ++k) {
      double dot = 0;
      for (int64_t i = 0; i < n; ++i) dot += p[i * r + j] * p[i * r + k];
      for (int64_t i = 0; i < n; ++i) p[i * r + j] -= dot * p[i * r + k];
    }
    double norm = 0;
    for (int64_t i = 0; i < n; ++i) norm += p[i * r + j] * p[i * r + j];
    for (int64_t i = 0; i < n; ++i) p[i * r + j] /= std::sqrt(norm);
  }
}

TEST(PowerSgd, OneStepIsTheAlgorithmInDoublePrecision) {
  const FlatGradients layout = layer_layout();
  const int ranks = 2, r = 3;
  const int64_t numel = layout.padded_numel();
  std::vector<std::vector<float>> results(ranks), errors(ranks);
  std::vector<float> q0;
  const auto failures = run_ranks(ranks, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    PowerSgd powersgd(layout, r, /*seed=*/5);
    if (rank == 0) {
      const Tensor q = powersgd.state().at(0).second;
      q0.assign(q.data<float>(), q.data<float>() + kCols * r);
    }
    const std::vector<float> mine = gradient_of(rank, numel);
    const Tensor g = Tensor::from_vector(mine, {numel});
    powersgd.reduce(g, *comm);
    results[static_cast<size_t>(rank)].assign(g.data<float>(), g.data<float>() + numel);
    const Tensor e = powersgd.state().at(1).second;
    errors[static_cast<size_t>(rank)].assign(e.data<float>(), e.data<float>() + numel);
  });
  for (const std::string& f : failures) ASSERT_EQ(f, "");
  ASSERT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)), 0)
      << "every rank has the same approximation";

  // The reference. The flat layout holds parameters in reverse order: the bias first.
  const int64_t bias_at = layout.offset(1), weight_at = layout.offset(0);
  std::vector<std::vector<float>> inputs = {gradient_of(0, numel), gradient_of(1, numel)};
  Matrix p(kRows * r, 0.0), q(kCols * r, 0.0);
  for (const auto& m : inputs)
    for (int64_t i = 0; i < kRows; ++i)
      for (int64_t k = 0; k < kCols; ++k)
        for (int j = 0; j < r; ++j) p[i * r + j] += double{m[weight_at + i * kCols + k]} * q0[k * r + j];
  orthonormalize(p, kRows, r);
  for (const auto& m : inputs)
    for (int64_t i = 0; i < kRows; ++i)
      for (int64_t k = 0; k < kCols; ++k)
        for (int j = 0; j < r; ++j) q[k * r + j] += double{m[weight_at + i * kCols + k]} * p[i * r + j];
  for (int64_t i = 0; i < kRows; ++i) {
    for (int64_t k = 0; k < kCols; ++k) {
      double approx = 0;
      for (int j = 0; j < r; ++j) approx += p[i * r + j] * q[k * r + j];
      const int64_t at = weight_at + i * kCols + k;
      EXPECT_NEAR(results[0][at], approx, 1e-4) << "element " << i << "," << k;
      for (int rank = 0; rank < ranks; ++rank) {
        EXPECT_NEAR(errors[rank][at], inputs[rank][at] - approx / ranks, 1e-4) << "rank " << rank << "'s error";
      }
    }
  }
  for (int64_t i = 0; i < kRows; ++i) {
    EXPECT_EQ(results[0][bias_at + i], inputs[0][bias_at + i] + inputs[1][bias_at + i]) << "bias " << i;
  }
}

// A sum of rank 2 is within reach of rank 2: P spans its columns, so P P^T M is M itself.
TEST(PowerSgd, ASumOfLowRankIsRecoveredWhole) {
  const FlatGradients layout = layer_layout();
  const int64_t numel = layout.padded_numel(), weight_at = layout.offset(0);
  std::vector<std::vector<float>> inputs(2, std::vector<float>(static_cast<size_t>(numel), 0.0f));
  for (int rank = 0; rank < 2; ++rank) {
    Philox random(3, static_cast<uint64_t>(rank));
    std::vector<float> u(kRows), v(kCols);
    for (float& x : u) x = static_cast<float>(random.next_normal());
    for (float& x : v) x = static_cast<float>(random.next_normal());
    for (int64_t i = 0; i < kRows; ++i)
      for (int64_t k = 0; k < kCols; ++k) inputs[rank][weight_at + i * kCols + k] = u[i] * v[k];
  }
  std::vector<float> result;
  const auto failures = run_ranks(2, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    PowerSgd powersgd(layout, 2, 0);
    const Tensor g = Tensor::from_vector(inputs[static_cast<size_t>(rank)], {numel});
    powersgd.reduce(g, *comm);
    if (rank == 0) result.assign(g.data<float>(), g.data<float>() + numel);
  });
  for (const std::string& f : failures) ASSERT_EQ(f, "");
  for (int64_t i = weight_at; i < weight_at + kRows * kCols; ++i) {
    EXPECT_NEAR(result[i], inputs[0][i] + inputs[1][i], 1e-4) << "element " << i;
  }
}

TEST(PowerSgd, ItsStateContinuesInANewObject) {
  const FlatGradients layout = layer_layout();
  const int64_t numel = layout.padded_numel();
  std::vector<float> continued, uninterrupted;
  const auto failures = run_ranks(2, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    PowerSgd first(layout, 2, 0), again(layout, 2, 0);
    const std::vector<float> g = gradient_of(rank, numel);
    const Tensor a = Tensor::from_vector(g, {numel});
    first.reduce(a, *comm);
    again.load_state(first.state());
    const Tensor next_a = Tensor::from_vector(g, {numel}), next_b = Tensor::from_vector(g, {numel});
    first.reduce(next_a, *comm);
    again.reduce(next_b, *comm);
    if (rank == 0) {
      uninterrupted.assign(next_a.data<float>(), next_a.data<float>() + numel);
      continued.assign(next_b.data<float>(), next_b.data<float>() + numel);
    }
  });
  for (const std::string& f : failures) ASSERT_EQ(f, "");
  EXPECT_EQ(std::memcmp(continued.data(), uninterrupted.data(), continued.size() * sizeof(float)), 0);
}

TEST(PowerSgd, SendsFewerElementsAndSaysHowMany) {
  const FlatGradients layout = layer_layout();
  const PowerSgd powersgd(layout, 4, 0);
  EXPECT_EQ(powersgd.compressed_matrices(), 1);
  EXPECT_EQ(powersgd.elements_sent(), (kRows + kCols) * 4 + kRows);
  // A matrix P and Q would not halve is sent whole.
  EXPECT_EQ(PowerSgd(FlatGradients({Tensor::zeros({4, 4})}), 4, 0).compressed_matrices(), 0);
}

}  // namespace
}  // namespace lockstep::parallel
