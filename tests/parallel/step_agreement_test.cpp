// The ranks' agreement on a step: the loss keeps the bits its own all-reduce gives, and when
// ranks fail every rank hears the same story, the lowest failed rank's.
#include "lockstep/parallel/step_agreement.h"

#include <gtest/gtest.h>

#include "parallel/rank_threads.h"

namespace lockstep::parallel {
namespace {

using rank_threads::run_ranks;

// Losses whose sum depends on the order it is taken in.
double loss_of(int rank) { return 1.0 / (3.0 + rank) + (rank % 2 ? 1e8 : -1e-8); }

// The step's tree over ranks [first, first + n): split at the largest power of two below n.
double tree_sum(int first, int n) {
  if (n == 1) return loss_of(first);
  int left = 1;
  while (left * 2 < n) left *= 2;
  return tree_sum(first, left) + tree_sum(first + left, n - left);
}

TEST(StepAgreement, TheLossHasTheBitsOfTheTreesSum) {
  for (int ranks : {1, 3, 5}) {
    const double expected = tree_sum(0, ranks);
    std::vector<AgreedStep> agreed(static_cast<size_t>(ranks));
    rank_threads::expect_no_errors(run_ranks(ranks, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
      const Tensor loss = Tensor::from_vector(std::vector<double>{loss_of(rank)}, {1});
      agreed[static_cast<size_t>(rank)] = agree_on_step(*comm, loss, "", Device::cpu());
    }));
    for (const AgreedStep& step : agreed) {
      EXPECT_EQ(step.failure, "") << ranks << " ranks";
      EXPECT_EQ(step.loss, expected) << ranks << " ranks";
    }
  }
}

TEST(StepAgreement, EveryRankHearsTheLowestFailedRank) {
  constexpr int kRanks = 4;
  std::vector<AgreedStep> agreed(kRanks);
  rank_threads::expect_no_errors(run_ranks(kRanks, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    const bool fails = rank == 1 || rank == 3;
    const Tensor loss = fails ? Tensor() : Tensor::from_vector(std::vector<double>{1.0}, {1});
    const std::string failure = fails ? "out of memory on cpu:" + std::to_string(rank) : "";
    agreed[static_cast<size_t>(rank)] = agree_on_step(*comm, loss, failure, Device::cpu());
    // The group goes on: the next step's agreement is an ordinary one.
    const AgreedStep next = agree_on_step(*comm, Tensor::from_vector(std::vector<double>{0.5}, {1}), "", Device::cpu());
    EXPECT_EQ(next.failure, "");
    EXPECT_EQ(next.loss, 2.0);
  }));
  for (const AgreedStep& step : agreed) EXPECT_EQ(step.failure, "rank 1 (and 1 other rank): out of memory on cpu:1");
}

}  // namespace
}  // namespace lockstep::parallel
