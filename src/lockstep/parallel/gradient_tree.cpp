#include "lockstep/parallel/gradient_tree.h"

#include "lockstep/comm/tree_reduce.h"
#include "lockstep/ops/ops.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/autograd/cuda/add_kernels.h"
#include "lockstep/comm/cuda/tree_reduce_kernel.h"
#include "lockstep/core/cuda/runtime.h"
#endif

namespace lockstep::parallel {
namespace {

#if LOCKSTEP_HAVE_CUDA
// out = left + right for count elements on a GPU, with tree_reduce's two-way sum: f32 and
// f64 add in their own dtype (one kernel, no staging); the other dtypes (bf16/f16 through
// f32, integers wrapping) go through comm's fold of rows, after copying the two operands
// into adjacent rows. out may be left or right.
void add_on_device(const void* left, const void* right, void* out, int64_t count, DType dtype, Device device) {
  if (count == 0) return;
  lockstep::cuda::OnDevice on(device);
  if (autograd::cuda::add_elements(left, right, out, count, dtype, on.stream())) return;  // f32, f64
  comm::check_reducible(dtype, comm::ReduceOp::sum);
  const Tensor rows = Tensor::empty({2, count}, dtype, device);
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  char* first = static_cast<char*>(rows.data_ptr());
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(first, left, bytes, cudaMemcpyDeviceToDevice, on.stream()));
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(first + bytes, right, bytes, cudaMemcpyDeviceToDevice, on.stream()));
  // rows is released on return while the fold is queued: the allocator reuses its memory
  // only for later work on this same stream.
  comm::cuda::tree_reduce_rows(first, count, 2, out, count, dtype, comm::ReduceOp::sum, on.stream());
}
#endif

// out = left + right (tree_reduce's two-way sum) for count elements of tensors on device.
void add_pair(const void* left, const void* right, void* out, int64_t count, DType dtype, Device device) {
#if LOCKSTEP_HAVE_CUDA
  if (device.is_cuda()) return add_on_device(left, right, out, count, dtype, device);
#endif
  (void)device;
  const void* inputs[2] = {left, right};
  comm::tree_reduce(inputs, 2, out, count, dtype, comm::ReduceOp::sum);
}

// Both sums' elements must be readable where the addition runs: on a GPU, that GPU's.
void check_same_place(const Tensor& a, const Tensor& b, size_t index) {
  LOCKSTEP_CHECK(same_memory(a.device(), b.device()))
      << "gradient " << index << " is on " << a.device() << " in one micro-batch and on " << b.device()
      << " in another; keep every leaf of a gradient tree on one device";
}

}  // namespace

GradientTree::GradientTree(DType rounding) : rounding_(rounding) {
  LOCKSTEP_CHECK(rounding == DType::f32 || rounding == DType::bf16 || rounding == DType::f16)
      << "a gradient tree rounds its sums to f32, bf16 or f16, not " << dtype_name(rounding);
}

void GradientTree::round(const Tensor& t, int64_t begin, int64_t end) const {
  if (rounding_ == DType::f32) return;
  LOCKSTEP_CHECK(t.dtype() == DType::f32 && t.device().is_cpu())
      << "rounding gradients to " << dtype_name(rounding_) << " needs f32 gradients on a CPU device, got "
      << dtype_name(t.dtype()) << " on " << t.device();
  float* data = t.data_ptr<float>();
  if (rounding_ == DType::bf16) {
    for (int64_t i = begin; i < end; ++i) data[i] = bf16_to_f32(f32_to_bf16(data[i]));
  } else {
    for (int64_t i = begin; i < end; ++i) data[i] = f16_to_f32(f32_to_f16(data[i]));
  }
}

void GradientTree::merge_into(Subtree& left, const Subtree& right) const {
  LOCKSTEP_CHECK(left.sums.size() == right.sums.size())
      << "gradient leaves differ in length: " << left.sums.size() << " vs " << right.sums.size() << " tensors";
  for (size_t i = 0; i < left.sums.size(); ++i) {
    const Tensor& a = left.sums[i];
    const Tensor& b = right.sums[i];
    LOCKSTEP_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype())
        << "gradient " << i << " changes shape or dtype between micro-batches: " << shape_str(a.shape()) << " "
        << dtype_name(a.dtype()) << " vs " << shape_str(b.shape()) << " " << dtype_name(b.dtype());
    check_same_place(a, b, i);
    add_pair(a.data_ptr(), b.data_ptr(), a.data_ptr(), a.numel(), a.dtype(), a.device());
    round(a, 0, a.numel());
  }
  left.leaves += right.leaves;
}

void GradientTree::add_leaf(std::vector<Tensor> leaf) {
  for (Tensor& t : leaf) {
    t = t.contiguous();
    round(t, 0, t.numel());
  }
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
  for (const Subtree& subtree : stack_) {
    const Tensor& sum = subtree.sums.at(0);
    LOCKSTEP_CHECK(subtree.sums.size() == 1 && sum.numel() == last.numel() && sum.dtype() == last.dtype())
        << "finish_range needs leaves of one flat tensor like `last` (" << last.numel() << " "
        << dtype_name(last.dtype()) << ")";
  }
  finish_part(slice(last, 0, begin, end), begin);
}

void GradientTree::finish_part(const Tensor& part, int64_t begin) const {
  LOCKSTEP_CHECK(part.is_contiguous() && begin >= 0) << "finish_part: a contiguous part starting at element >= 0";
  const size_t element = dtype_size(part.dtype());
  const int64_t count = part.numel();
  round(part, 0, count);  // the final leaf
  // The counter's merges and finish() both fold the subtrees from the right: S0 + (S1 + ...
  // (Sm + last)), each addition with the earlier samples on the left.
  for (size_t i = stack_.size(); i-- > 0;) {
    const Tensor& sum = stack_[i].sums.at(0);
    LOCKSTEP_CHECK(stack_[i].sums.size() == 1 && begin + count <= sum.numel() && sum.dtype() == part.dtype())
        << "finish_part needs leaves of one flat " << dtype_name(part.dtype()) << " tensor holding elements [" << begin
        << ", " << begin + count << ")";
    check_same_place(sum, part, 0);
    add_pair(static_cast<const char*>(sum.data_ptr()) + static_cast<size_t>(begin) * element, part.data_ptr(),
             part.data_ptr(), count, part.dtype(), part.device());
    round(part, 0, count);
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
