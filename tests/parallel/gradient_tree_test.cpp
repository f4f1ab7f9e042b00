// GradientTree folds leaves as the split-at-the-largest-power-of-two tree: checked against
// the conformance suite's recursive fold, on values where any other order gives other bits.
#include "lockstep/parallel/gradient_tree.h"

#include <gtest/gtest.h>

#include <cstring>

#include "comm/conformance.h"

namespace lockstep::parallel {
namespace {

using comm::testing::reference_tree_sum;

TEST(GradientTree, EveryLeafCountFoldsInTreeOrder) {
  for (int n = 1; n <= 20; ++n) {
    GradientTree tree;
    const int64_t count = 64;
    std::vector<std::vector<float>> columns(count);
    for (int leaf = 0; leaf < n; ++leaf) {
      std::vector<float> values(count);
      for (int64_t i = 0; i < count; ++i) {
        values[i] = comm::testing::irregular_value(leaf, i);
        columns[i].push_back(values[i]);
      }
      tree.add_leaf({Tensor::from_vector(values, {8, 8})});
    }
    EXPECT_EQ(tree.leaves(), n);
    const std::vector<Tensor> sums = tree.finish();
    ASSERT_EQ(sums.size(), 1u);
    EXPECT_EQ(sums[0].shape(), (Shape{8, 8}));
    const float* got = sums[0].data<float>();
    for (int64_t i = 0; i < count; ++i) {
      const float want = reference_tree_sum(columns[i].data(), static_cast<int>(columns[i].size()));
      ASSERT_EQ(std::memcmp(&got[i], &want, 4), 0) << n << " leaves, element " << i << ": " << got[i] << " vs " << want;
    }
  }
}

// The final leaf folded range by range, in any order of ranges, is the tree's sum.
TEST(GradientTree, FinishRangeGivesTheTreesBitsRangeByRange) {
  for (int n = 1; n <= 12; ++n) {
    const int64_t count = 64;
    std::vector<std::vector<float>> columns(count);
    GradientTree tree;
    std::vector<float> last(count);
    for (int leaf = 0; leaf < n; ++leaf) {
      std::vector<float> values(count);
      for (int64_t i = 0; i < count; ++i) {
        values[i] = comm::testing::irregular_value(leaf, i);
        columns[i].push_back(values[i]);
      }
      if (leaf + 1 < n) {
        tree.add_leaf({Tensor::from_vector(values, {count})});
      } else {
        last = values;
      }
    }
    const Tensor out = Tensor::from_vector(last, {count});
    for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{40, 64}, {0, 17}, {17, 40}}) {
      tree.finish_range(out, begin, end);
    }
    tree.clear();
    EXPECT_EQ(tree.leaves(), 0);
    const float* got = out.data<float>();
    for (int64_t i = 0; i < count; ++i) {
      const float want = reference_tree_sum(columns[i].data(), static_cast<int>(columns[i].size()));
      ASSERT_EQ(std::memcmp(&got[i], &want, 4), 0) << n << " leaves, element " << i;
    }
  }
}

TEST(GradientTree, MismatchedLeavesAreErrors) {
  GradientTree tree;
  tree.add_leaf({Tensor::zeros({3})});
  EXPECT_THROW(tree.add_leaf({Tensor::zeros({4})}), Error);
  EXPECT_THROW(GradientTree().finish(), Error);
}

}  // namespace
}  // namespace lockstep::parallel
