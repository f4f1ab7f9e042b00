// "The step is a tree": the gradients of a step's micro-batches, taken in sample order,
// are summed as the balanced binary tree of comm/tree_reduce.h (split at the largest power
// of two). GradientTree folds leaves as they come, like a binary counter: equal-sized
// subtrees merge at once, and finish() folds what is left from the right. A device that
// owns k leaves (k a power of two) folds exactly its subtree of the global tree, and the
// all-reduce over devices, in the same order, folds the rest.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/core/tensor.h"

namespace lockstep::parallel {

class GradientTree {
 public:
  // rounding: f32 (the default) keeps every sum as the leaves' dtype computes it; bf16 or
  // f16 rounds every leaf and every node's sum to that precision (the values stay f32
  // tensors on CPU devices), so that a rank's subtree can cross to the others in bf16
  // exactly and the rest of the tree is comm's rounded_sum: the same bits on any number of
  // ranks.
  explicit GradientTree(DType rounding = DType::f32);

  // Adds the next leaf: one tensor per parameter (the tree takes them over and adds into
  // them). Every leaf has the same shapes and dtypes.
  void add_leaf(std::vector<Tensor> leaf);
  // The sum of all leaves in tree order; the tree is empty afterwards.
  std::vector<Tensor> finish();
  int64_t leaves() const { return leaves_; }

  // For leaves of one flat tensor: writes into elements [begin, end) of `last` what
  // add_leaf(last) then finish() would give there — the sum of every leaf so far with
  // `last` as the final one — and leaves the tree as it is. Distributed data parallelism
  // reduces each bucket of the final micro-batch this way while backward still computes
  // the others. clear() once every range is done.
  void finish_range(const Tensor& last, int64_t begin, int64_t end) const;
  // The same where only that range of the final leaf exists: `part` holds elements
  // [begin, begin + part.numel()) of it (ZeRO-2 keeps one bucket's gradients at a time).
  void finish_part(const Tensor& part, int64_t begin) const;
  void clear();

 private:
  struct Subtree {
    int64_t leaves = 0;
    std::vector<Tensor> sums;
  };
  // left += right, element by element (left is the earlier samples).
  void merge_into(Subtree& left, const Subtree& right) const;

  // Rounds elements [begin, end) of t to rounding_ (nothing under f32).
  void round(const Tensor& t, int64_t begin, int64_t end) const;

  DType rounding_;
  std::vector<Subtree> stack_;  // sizes strictly decreasing from the bottom
  int64_t leaves_ = 0;
};

}  // namespace lockstep::parallel
