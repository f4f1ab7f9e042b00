// GradientTree folds leaves as the split-at-the-largest-power-of-two tree: checked against
// the conformance suite's recursive fold, on values where any other order gives other bits.
#include "lockstep/parallel/gradient_tree.h"

#include <gtest/gtest.h>

#include <cstring>

#include "comm/conformance.h"
#include "lockstep/comm/tree_reduce.h"
#include "lockstep/ops/ops.h"

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
TEST(GradientTree, FinishRangeAndFinishPartGiveTheTreesBitsRangeByRange) {
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
    const std::vector<std::pair<int64_t, int64_t>> ranges{{40, 64}, {0, 17}, {17, 40}};
    for (const auto& [begin, end] : ranges) tree.finish_range(out, begin, end);
    // The same ranges as parts of their own, where the final leaf holds only that range
    // (ZeRO-2's bucket buffers).
    const Tensor parts = Tensor::zeros({count});
    for (const auto& [begin, end] : ranges) {
      const Tensor part =
          Tensor::from_vector(std::vector<float>(last.begin() + begin, last.begin() + end), {end - begin});
      tree.finish_part(part, begin);
      slice(parts, 0, begin, end).copy_from(part);
    }
    tree.clear();
    EXPECT_EQ(tree.leaves(), 0);
    const float* got = out.data<float>();
    const float* got_parts = parts.data<float>();
    for (int64_t i = 0; i < count; ++i) {
      const float want = reference_tree_sum(columns[i].data(), static_cast<int>(columns[i].size()));
      ASSERT_EQ(std::memcmp(&got[i], &want, 4), 0) << n << " leaves, element " << i;
      ASSERT_EQ(std::memcmp(&got_parts[i], &want, 4), 0) << n << " leaves, element " << i << " by parts";
    }
  }
}

float to_bf16_precision(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// The tree with every leaf and every node rounded to bf16, written out on its own.
float rounded_reference(const float* v, int n) {
  if (n == 1) return to_bf16_precision(v[0]);
  int p = 1;
  while (p * 2 < n) p *= 2;
  return to_bf16_precision(rounded_reference(v, p) + rounded_reference(v + p, n - p));
}

TEST(GradientTree, BfloatRoundingRoundsEveryLeafAndNode) {
  const int64_t count = 64;
  for (int n = 1; n <= 12; ++n) {
    GradientTree tree(DType::bf16);
    GradientTree ranged(DType::bf16);
    std::vector<std::vector<float>> columns(count);
    Tensor last;
    for (int leaf = 0; leaf < n; ++leaf) {
      std::vector<float> values(count);
      for (int64_t i = 0; i < count; ++i) {
        values[i] = comm::testing::irregular_value(leaf, i);
        columns[i].push_back(values[i]);
      }
      tree.add_leaf({Tensor::from_vector(values, {count})});
      if (leaf + 1 < n) {
        ranged.add_leaf({Tensor::from_vector(values, {count})});
      } else {
        last = Tensor::from_vector(values, {count});
      }
    }
    ranged.finish_range(last, 0, count / 2);
    ranged.finish_range(last, count / 2, count);
    const float* got = tree.finish()[0].data<float>();
    for (int64_t i = 0; i < count; ++i) {
      const float want = rounded_reference(columns[i].data(), n);
      ASSERT_EQ(std::memcmp(&got[i], &want, 4), 0) << n << " leaves, element " << i << ": " << got[i] << " vs " << want;
      ASSERT_EQ(std::memcmp(&last.data<float>()[i], &want, 4), 0) << "finish_range, " << n << " leaves, element " << i;
    }
  }
}

// What data parallelism stands on: 4 ranks' trees over 2 leaves each, summed by comm's
// rounded_sum in bf16, are one tree over the 8 leaves.
TEST(GradientTree, BfloatSubtreesAndRoundedSumMakeTheWholeTree) {
  const int64_t count = 256;
  GradientTree whole(DType::bf16);
  std::vector<std::vector<uint16_t>> partials(4, std::vector<uint16_t>(count));
  for (int rank = 0; rank < 4; ++rank) {
    GradientTree mine(DType::bf16);
    for (int leaf = 2 * rank; leaf < 2 * rank + 2; ++leaf) {
      std::vector<float> values(count);
      for (int64_t i = 0; i < count; ++i) values[i] = comm::testing::irregular_value(leaf, i) * (1 + leaf % 3);
      whole.add_leaf({Tensor::from_vector(values, {count})});
      mine.add_leaf({Tensor::from_vector(values, {count})});
    }
    const Tensor sum = mine.finish()[0];
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(to_bf16_precision(sum.data<float>()[i]), sum.data<float>()[i]) << "a subtree is bf16-exact";
      partials[rank][i] = f32_to_bf16(sum.data<float>()[i]);
    }
  }
  const void* inputs[4] = {partials[0].data(), partials[1].data(), partials[2].data(), partials[3].data()};
  std::vector<uint16_t> reduced(count);
  comm::tree_reduce(inputs, 4, reduced.data(), count, DType::bf16, comm::ReduceOp::rounded_sum);
  const float* want = whole.finish()[0].data<float>();
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(bf16_to_f32(reduced[i]), want[i]) << "element " << i;
}

TEST(GradientTree, MismatchedLeavesAreErrors) {
  GradientTree tree;
  tree.add_leaf({Tensor::zeros({3})});
  EXPECT_THROW(tree.add_leaf({Tensor::zeros({4})}), Error);
  EXPECT_THROW(GradientTree().finish(), Error);
}

}  // namespace
}  // namespace lockstep::parallel
