// GradientTree on each test device: leaves on a GPU fold in the same tree order, with the
// same bits, as the conformance suite's recursive fold (f32, f64) and as comm::tree_reduce
// on the host (bf16, which the GPU folds through f32 as the host does).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "comm/conformance.h"
#include "lockstep/comm/tree_reduce.h"
#include "lockstep/parallel/gradient_tree.h"
#include "testing/devices.h"

namespace lockstep::parallel {
namespace {

// Not a multiple of any block size, and more than one block of elements.
constexpr int64_t kCount = 3 * 347;

// Values whose sum depends on the order they are added in: irregular mantissas at
// magnitudes that differ from leaf to leaf.
template <typename T>
T leaf_value(int leaf, int64_t i) {
  const double scale = std::ldexp(1.0, (leaf % 4) * 9 - 12);
  return static_cast<T>(static_cast<double>(comm::testing::irregular_value(leaf, i)) * scale * (1.0 + 1e-9 * leaf));
}

template <typename T>
Tensor leaf_tensor(int leaf, const Shape& shape, int64_t offset, Device device) {
  std::vector<T> values(static_cast<size_t>(numel(shape)));
  for (size_t i = 0; i < values.size(); ++i) values[i] = leaf_value<T>(leaf, offset + static_cast<int64_t>(i));
  return Tensor::from_vector(values, shape, device);
}

template <typename T>
void expect_same_bits(const Tensor& got, const std::vector<std::vector<T>>& columns, const char* what) {
  const std::vector<T> values = got.to(Device::cpu()).to_vector<T>();
  ASSERT_EQ(values.size(), columns.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const T want = comm::testing::reference_tree_sum(columns[i].data(), static_cast<int>(columns[i].size()));
    ASSERT_EQ(std::memcmp(&values[i], &want, sizeof(T)), 0)
        << what << " element " << i << ": " << values[i] << " vs " << want << " (" << columns[i].size() << " leaves)";
  }
}

class CudaGradientTree : public testing::DeviceTest {};

template <typename T>
void check_leaf_counts(Device device) {
  const Shape big{3, 347}, small{1};
  for (int n = 1; n <= 9; ++n) {
    GradientTree tree;
    std::vector<std::vector<T>> big_columns(static_cast<size_t>(kCount)), small_columns(1);
    for (int leaf = 0; leaf < n; ++leaf) {
      const Tensor a = leaf_tensor<T>(leaf, big, 0, device), b = leaf_tensor<T>(leaf, small, kCount, device);
      const std::vector<T> a_values = a.to_vector<T>();
      for (int64_t i = 0; i < kCount; ++i)
        big_columns[static_cast<size_t>(i)].push_back(a_values[static_cast<size_t>(i)]);
      small_columns[0].push_back(b.to_vector<T>()[0]);
      tree.add_leaf({a, b});
    }
    EXPECT_EQ(tree.leaves(), n);
    const std::vector<Tensor> sums = tree.finish();
    ASSERT_EQ(sums.size(), 2u);
    EXPECT_EQ(sums[0].device(), device);
    EXPECT_EQ(sums[0].shape(), big);
    expect_same_bits(sums[0], big_columns, "big");
    expect_same_bits(sums[1], small_columns, "small");
  }
}

TEST_P(CudaGradientTree, EveryLeafCountFoldsInTreeOrder) {
  check_leaf_counts<float>(GetParam());
  check_leaf_counts<double>(GetParam());
}

// The final leaf folded range by range, in any order of ranges, is the tree's sum.
TEST_P(CudaGradientTree, FinishRangeGivesTheTreesBitsRangeByRange) {
  const Device device = GetParam();
  for (int n = 1; n <= 7; ++n) {
    GradientTree tree;
    std::vector<std::vector<float>> columns(static_cast<size_t>(kCount));
    Tensor last;
    for (int leaf = 0; leaf < n; ++leaf) {
      const Tensor values = leaf_tensor<float>(leaf, {kCount}, 0, device);
      const std::vector<float> host = values.to_vector<float>();
      for (int64_t i = 0; i < kCount; ++i) columns[static_cast<size_t>(i)].push_back(host[static_cast<size_t>(i)]);
      if (leaf + 1 < n) {
        tree.add_leaf({values});
      } else {
        last = values;
      }
    }
    for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{700, kCount}, {0, 17}, {17, 700}})
      tree.finish_range(last, begin, end);
    tree.clear();
    EXPECT_EQ(tree.leaves(), 0);
    expect_same_bits(last, columns, "finish_range");
  }
}

// The tree fold of leaves [lo, hi) with tree_reduce's two-way sum at every node, on the host:
// for bf16 each partial sum is rounded to bf16, as merging two subtrees' sums rounds it.
Tensor host_pairwise_fold(const std::vector<Tensor>& leaves, size_t lo, size_t hi) {
  if (hi - lo == 1) return leaves[lo];
  size_t p = 1;
  while (p * 2 < hi - lo) p *= 2;
  const Tensor left = host_pairwise_fold(leaves, lo, lo + p), right = host_pairwise_fold(leaves, lo + p, hi);
  const Tensor out = Tensor::empty(left.shape(), left.dtype());
  const void* inputs[2] = {left.raw_data(), right.raw_data()};
  comm::tree_reduce(inputs, 2, out.raw_data(), out.numel(), out.dtype(), comm::ReduceOp::sum);
  return out;
}

// bf16 takes another path on a GPU (comm's fold kernel, through f32): compared with the
// host's tree_reduce on the same bytes.
TEST_P(CudaGradientTree, Bf16LeavesFoldAsTreeReduceOnTheHost) {
  const Device device = GetParam();
  for (int n : {2, 3, 5, 8}) {
    GradientTree tree;
    std::vector<Tensor> host_leaves;
    for (int leaf = 0; leaf < n; ++leaf) {
      const Tensor host = leaf_tensor<float>(leaf, {kCount}, 0, Device::cpu()).to(DType::bf16);
      host_leaves.push_back(host);
      Tensor on_device = Tensor::empty({kCount}, DType::bf16, device);
      on_device.copy_from(host);
      tree.add_leaf({on_device});
    }
    const Tensor sum = tree.finish().at(0).to(Device::cpu());
    ASSERT_EQ(sum.dtype(), DType::bf16);
    const Tensor want = host_pairwise_fold(host_leaves, 0, host_leaves.size());
    EXPECT_EQ(std::memcmp(sum.raw_data(), want.raw_data(), want.nbytes()), 0) << n << " leaves";
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaGradientTree, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep::parallel
