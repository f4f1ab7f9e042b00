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

void GradientTree::finish_range(const Tensor& last, int64_t begin, int64_t end) const {
  LOCKSTEP_CHECK(last.is_contiguous() && begin >= 0 && begin <= end && end <= last.numel())
      << "finish_range: elements [" << begin << ", " << end << ") of a tensor of " << last.numel();
  const size_t element = dtype_size(last.dtype());
  char* out = static_cast<char*>(last.raw_data()) + static_cast<size_t>(begin) * element;
  // The counter's merges and finish() both fold the subtrees from the right: S0 + (S1 + ...
  // (Sm + last)), each addition with the earlier samples on the left.
  for (size_t i = stack_.size(); i-- > 0;) {
    const Tensor& sum = stack_[i].sums.at(0);
    LOCKSTEP_CHECK(stack_[i].sums.size() == 1 && sum.numel() == last.numel() && sum.dtype() == last.dtype())
        << "finish_range needs leaves of one flat tensor like `last` (" << last.numel() << " "
        << dtype_name(last.dtype()) << ")";
    const void* inputs[2] = {static_cast<const char*>(sum.raw_data()) + static_cast<size_t>(begin) * element, out};
    comm::tree_reduce(inputs, 2, out, end - begin, last.dtype(), comm::ReduceOp::sum);
  }
}

void GradientTree::clear() {
  stack_.clear();
  leaves_ = 0;
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
