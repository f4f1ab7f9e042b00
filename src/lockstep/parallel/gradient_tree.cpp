#include "lockstep/parallel/gradient_tree.h"

#include "lockstep/comm/tree_reduce.h"

namespace lockstep::parallel {

void GradientTree::merge_into(Subtree& left, const Subtree& right) {
  LOCKSTEP_CHECK(left.sums.size() == right.sums.size())
      << "gradient leaves differ in length: " << left.sums.size() << " vs " << right.sums.size() << " tensors";
  for (size_t i = 0; i < left.sums.size(); ++i) {
    const Tensor& a = left.sums[i];
    const Tensor& b = right.sums[i];
    LOCKSTEP_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype())
        << "gradient " << i << " changes shape or dtype between micro-batches: " << shape_str(a.shape()) << " "
        << dtype_name(a.dtype()) << " vs " << shape_str(b.shape()) << " " << dtype_name(b.dtype());
    const void* inputs[2] = {a.raw_data(), b.raw_data()};
    comm::tree_reduce(inputs, 2, a.raw_data(), a.numel(), a.dtype(), comm::ReduceOp::sum);
  }
  left.leaves += right.leaves;
}

void GradientTree::add_leaf(std::vector<Tensor> leaf) {
  for (Tensor& t : leaf) t = t.contiguous();
  stack_.push_back({1, std::move(leaf)});
  ++leaves_;
  while (stack_.size() >= 2 && stack_[stack_.size() - 2].leaves == stack_.back().leaves) {
    merge_into(stack_[stack_.size() - 2], stack_.back());
    stack_.pop_back();
  }
}

std::vector<Tensor> GradientTree::finish() {
  LOCKSTEP_CHECK(!stack_.empty()) << "GradientTree::finish with no leaves";
  while (stack_.size() >= 2) {
    merge_into(stack_[stack_.size() - 2], stack_.back());
    stack_.pop_back();
  }
  std::vector<Tensor> sums = std::move(stack_.back().sums);
  stack_.clear();
  leaves_ = 0;
  return sums;
}

}  // namespace lockstep::parallel
