#include "lockstep/core/philox.h"

#include <gtest/gtest.h>

#include <set>

namespace lockstep {
namespace {

// Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors).
TEST(Philox, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(philox4x32(0, 0, 0), (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32(~0ull, ~0ull, ~0ull),
            (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
}

TEST(Philox, SequentialDrawsAreTheCounterBlocks) {
  Philox rng(7, 3, 10);
  const auto block = philox4x32(7, 3, 10);
  for (uint32_t word : block) EXPECT_EQ(rng.next_u32(), word);
  EXPECT_EQ(rng.counter(), 11u);
}

TEST(Philox, NextBelowCoversTheRangeUniformly) {
  Philox rng(1, 2);
  std::vector<int> counts(10);
  for (int i = 0; i < 100000; ++i) counts[rng.next_below(10)]++;
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
}

TEST(Philox, NormalHasUnitVariance) {
  Philox rng(5, 6);
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = rng.next_normal();
    sum += x;
    sum_sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.02);
}

}  // namespace
}  // namespace lockstep
