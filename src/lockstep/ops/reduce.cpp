// Reductions: argument checks, the kernels of ops/cpu/reduce (and, on GPUs,
// ops/cuda/reduce_kernels), and backward functions (a sum's gradient is its incoming
// gradient broadcast back over the reduced axes).
#include "lockstep/ops/reduce.h"

#include <string>

#include "lockstep/autograd/node.h"
#include "lockstep/ops/cpu/elementwise.h"
#include "lockstep/ops/cpu/reduce.h"
#include "lockstep/ops/dispatch.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/ops/cuda/elementwise_kernels.h"
#include "lockstep/ops/cuda/reduce_kernels.h"
#endif

namespace lockstep {
namespace {

void check_input(const char* op, const Tensor& x) {
  ops::require_device(op, ops::common_device(op, {x}));
  ops::require_float(op, x);
}

#if LOCKSTEP_HAVE_CUDA
ops::cuda::ShapeRef shape_ref(const Shape& shape) { return {shape.data(), static_cast<int>(shape.size())}; }

// cpu::sum_axes on a GPU, with the same passes (cpu::plan_sum_axes), through scratch tensors
// on the device. x is contiguous; out receives the kept axes.
template <typename T>
void cuda_sum_axes(const Tensor& x, const std::vector<bool>& reduce, const Tensor& out) {
  const std::vector<cpu::SumPass> passes = cpu::plan_sum_axes(x.shape(), reduce);
  if (passes.empty()) {
    out.copy_from(x.as_strided(out.shape(), contiguous_strides(out.shape()), x.offset()));
    return;
  }
  const lockstep::cuda::OnDevice on(x.device());
  Tensor src = x;
  for (size_t p = 0; p < passes.size(); ++p) {
    const cpu::SumPass& pass = passes[p];
    const Tensor dst = p + 1 < passes.size() ? Tensor::empty({pass.outer * pass.inner}, x.dtype(), x.device()) : out;
    const int64_t scratch = ops::cuda::sum_middle_workspace(pass.outer, pass.n, pass.inner);
    const Tensor workspace = scratch > 0 ? Tensor::empty({scratch}, x.dtype(), x.device()) : Tensor();
    ops::cuda::sum_middle<T>(src.data_ptr<T>(), pass.outer, pass.n, pass.inner, dst.data_ptr<T>(),
                             scratch > 0 ? workspace.data_ptr<T>() : nullptr, on.stream());
    src = dst;
  }
}
#endif

int64_t checked_axis(const char* op, int64_t axis, const Tensor& x) {
  const int64_t rank = x.dim();
  const int64_t wrapped = axis < 0 ? axis + rank : axis;
  LOCKSTEP_CHECK(wrapped >= 0 && wrapped < rank)
      << op << ": axis " << axis << " is out of range for a tensor of shape " << shape_str(x.shape()) << " (valid: "
      << (rank == 0 ? "none, it is 0-d; reduce it whole" : std::to_string(-rank) + " to " + std::to_string(rank - 1))
      << ")";
  return wrapped;
}

// The reduced axes as a mask over x's axes; repeated axes are an error.
std::vector<bool> axes_mask(const char* op, const Tensor& x, const std::vector<int64_t>& axes) {
  std::vector<bool> mask(static_cast<size_t>(x.dim()), false);
  for (int64_t axis : axes) {
    const auto a = static_cast<size_t>(checked_axis(op, axis, x));
    LOCKSTEP_CHECK(!mask[a]) << op << ": axis " << axis << " is listed twice in axes " << shape_str(axes);
    mask[a] = true;
  }
  return mask;
}

// Sums x over the masked axes into a tensor of out_shape (x's kept axes, with or without
// size-1 placeholders); records a backward that broadcasts the gradient back, times scale
// (1/count for a mean).
Tensor reduce_sum(const char* op, const char* backward_name, const Tensor& x, const std::vector<bool>& mask,
                  const Shape& out_shape, bool mean) {
  const Tensor xc = x.contiguous();
  Shape keep_shape = x.shape();  // the output as a broadcastable shape of x's rank
  int64_t count = 1;
  for (size_t i = 0; i < mask.size(); ++i) {
    if (!mask[i]) continue;
    count *= keep_shape[i];
    keep_shape[i] = 1;
  }
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  ops::dispatch_float(op, x.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
    if (x.device().is_cuda()) {
      cuda_sum_axes<T>(xc, mask, out);
      if (mean) {
        const lockstep::cuda::OnDevice on(x.device());
        ops::cuda::divide<T>(out.data_ptr<T>(), out.numel(), static_cast<T>(count), on.stream());
      }
      return;
    }
#endif
    T* o = out.data<T>();
    cpu::sum_axes<T>(xc.data<T>(), xc.shape(), mask, o);
    if (mean) {
      const T divisor = static_cast<T>(count);
      for (int64_t i = 0; i < out.numel(); ++i) o[i] /= divisor;
    }
  });
  const double scale = mean ? 1.0 / static_cast<double>(count) : 1.0;
  autograd::record(
      backward_name, {xc}, {out}, [keep_shape, in_shape = x.shape(), scale, op](const std::vector<Tensor>& g) {
        const Tensor grad = g[0].contiguous();
        Tensor grad_x = Tensor::empty(in_shape, grad.dtype(), grad.device());
        ops::dispatch_float(op, grad.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
          if (grad.device().is_cuda()) {
            const lockstep::cuda::OnDevice on(grad.device());
            ops::cuda::broadcast_to<T>(grad.data_ptr<T>(), shape_ref(keep_shape), grad_x.data_ptr<T>(),
                                       shape_ref(in_shape), static_cast<T>(scale), on.stream());
            return;
          }
#endif
          cpu::broadcast_to<T>(grad.data<T>(), keep_shape, grad_x.data<T>(), in_shape, static_cast<T>(scale));
        });
        return std::vector<Tensor>{grad_x};
      });
  return out;
}

Tensor reduce_axes(const char* op, const char* backward_name, const Tensor& x, const std::vector<int64_t>& axes,
                   bool keepdim, bool mean) {
  check_input(op, x);
  const std::vector<bool> mask = axes_mask(op, x, axes);
  Shape out_shape;
  for (size_t i = 0; i < mask.size(); ++i) {
    if (!mask[i]) {
      out_shape.push_back(x.shape()[i]);
    } else if (keepdim) {
      out_shape.push_back(1);
    }
  }
  return reduce_sum(op, backward_name, x, mask, out_shape, mean);
}

// x viewed as [outer, n, inner] around `axis`, and the output shape of a reduction along it.
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
  Shape out_shape;
};

AxisSplit split_at(const Tensor& x, int64_t axis, bool keepdim) {
  AxisSplit split;
  for (int64_t i = 0; i < x.dim(); ++i) {
    const int64_t d = x.shape()[static_cast<size_t>(i)];
    if (i < axis) split.outer *= d;
    if (i > axis) split.inner *= d;
    if (i == axis) {
      split.n = d;
      if (keepdim) split.out_shape.push_back(1);
    } else {
      split.out_shape.push_back(d);
    }
  }
  return split;
}

}  // namespace

Tensor sum(const Tensor& x) {
  check_input("sum", x);
  return reduce_sum("sum", "SumBackward", x, std::vector<bool>(static_cast<size_t>(x.dim()), true), {}, false);
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return reduce_axes("sum", "SumBackward", x, axes, keepdim, false);
}

Tensor mean(const Tensor& x) {
  check_input("mean", x);
  return reduce_sum("mean", "MeanBackward", x, std::vector<bool>(static_cast<size_t>(x.dim()), true), {}, true);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return reduce_axes("mean", "MeanBackward", x, axes, keepdim, true);
}

namespace {

// The largest values along one axis (when `values` is wanted) and the first position of
// each: the shared half of max and argmax.
struct AxisMax {
  Tensor input;  // x, contiguous
  AxisSplit split;
  Tensor values;   // undefined unless wanted
  Tensor indices;  // i64
};

AxisMax max_along(const char* op, const Tensor& x, int64_t axis, bool keepdim, bool want_values) {
  check_input(op, x);
  const int64_t a = checked_axis(op, axis, x);
  AxisMax m{x.contiguous(), split_at(x, a, keepdim), {}, {}};
  LOCKSTEP_CHECK(m.split.n > 0) << op << ": axis " << axis << " of shape " << shape_str(x.shape())
                                << " is empty, so it has no largest value";
  if (want_values) m.values = Tensor::empty(m.split.out_shape, x.dtype(), x.device());
  m.indices = Tensor::empty(m.split.out_shape, DType::i64, x.device());
  ops::dispatch_float(op, x.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
    if (x.device().is_cuda()) {
      const lockstep::cuda::OnDevice on(x.device());
      ops::cuda::max_middle<T>(m.input.data_ptr<T>(), m.split.outer, m.split.n, m.split.inner,
                               want_values ? m.values.data_ptr<T>() : nullptr, m.indices.data_ptr<int64_t>(),
                               on.stream());
      return;
    }
#endif
    cpu::max_middle<T>(m.input.data<T>(), m.split.outer, m.split.n, m.split.inner,
                       want_values ? m.values.data<T>() : nullptr, m.indices.data<int64_t>());
  });
  return m;
}

}  // namespace

Tensor max(const Tensor& x, int64_t axis, bool keepdim) {
  const AxisMax m = max_along("max", x, axis, keepdim, true);
  autograd::record("MaxBackward", {m.input}, {m.values},
                   [indices = m.indices, split = m.split, in_shape = x.shape()](const std::vector<Tensor>& g) {
                     const Tensor grad = g[0].contiguous();
#if LOCKSTEP_HAVE_CUDA
                     if (grad.device().is_cuda()) {
                       // Every element written (the gradient or 0), so no zero fill first.
                       Tensor grad_x = Tensor::empty(in_shape, grad.dtype(), grad.device());
                       ops::dispatch_float("max", grad.dtype(), [&]<typename T>() {
                         const lockstep::cuda::OnDevice on(grad.device());
                         ops::cuda::max_backward<T>(grad.data_ptr<T>(), indices.data_ptr<int64_t>(), split.outer,
                                                    split.n, split.inner, grad_x.data_ptr<T>(), on.stream());
                       });
                       return std::vector<Tensor>{grad_x};
                     }
#endif
                     Tensor grad_x = Tensor::zeros(in_shape, grad.dtype(), grad.device());
                     ops::dispatch_float("max", grad.dtype(), [&]<typename T>() {
                       const T* src = grad.data<T>();
                       const int64_t* index = indices.data<int64_t>();
                       T* dst = grad_x.data<T>();
                       for (int64_t o = 0; o < split.outer; ++o)
                         for (int64_t j = 0; j < split.inner; ++j) {
                           const int64_t k = o * split.inner + j;
                           dst[(o * split.n + index[k]) * split.inner + j] = src[k];
                         }
                     });
                     return std::vector<Tensor>{grad_x};
                   });
  return m.values;
}

Tensor argmax(const Tensor& x, int64_t axis, bool keepdim) {
  return max_along("argmax", x, axis, keepdim, false).indices;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  check_input("sum_to", x);
  if (x.shape() == shape) return x;
  const size_t rank = x.shape().size();
  const bool fits = shape.size() <= rank && [&] {
    for (size_t i = 0; i < shape.size(); ++i) {
      const int64_t d = x.shape()[rank - shape.size() + i];
      if (shape[i] != d && shape[i] != 1) return false;
    }
    return true;
  }();
  LOCKSTEP_CHECK(fits) << "sum_to: cannot sum a tensor of shape " << shape_str(x.shape()) << " down to "
                       << shape_str(shape)
                       << " (the target must broadcast to the tensor: aligned from the last axis, each target "
                          "axis equals the tensor's or is 1)";
  // Reduce the leading extra axes and the axes the target holds as 1; the kept axes are the
  // target's in order, so the result is already laid out as `shape`.
  std::vector<bool> mask(rank, false);
  const size_t lead = rank - shape.size();
  for (size_t i = 0; i < rank; ++i) mask[i] = i < lead || (shape[i - lead] == 1 && x.shape()[i] != 1);
  return reduce_sum("sum_to", "SumToBackward", x, mask, shape, false);
}

}  // namespace lockstep
