// Softmax, log-softmax and cross-entropy: argument checks, the kernels of ops/cpu/softmax (or
// ops/cuda/softmax_kernels on a GPU), and backward functions computed directly from the saved
// output (no chain of generic ops).
#include "lockstep/ops/loss.h"

#include <string>

#include "lockstep/autograd/node.h"
#include "lockstep/ops/cpu/reduce.h"
#include "lockstep/ops/cpu/softmax.h"
#include "lockstep/ops/dispatch.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/ops/cuda/softmax_kernels.h"
#endif

namespace lockstep {
namespace {

// y = softmax (or log_softmax) of the contiguous x along the middle axis of [outer, n, inner].
void softmax_kernel(const char* op, const Tensor& x, const Tensor& y, int64_t outer, int64_t n, int64_t inner,
                    bool log) {
#if LOCKSTEP_HAVE_CUDA
  if (x.device().is_cuda()) {
    lockstep::cuda::OnDevice on(x.device());
    ops::dispatch_float(op, x.dtype(), [&]<typename T>() {
      ops::cuda::softmax_forward<T>(x.data_ptr<T>(), y.data_ptr<T>(), outer, n, inner, log, on.stream());
    });
    return;
  }
#endif
  ops::dispatch_float(op, x.dtype(),
                      [&]<typename T>() { cpu::softmax<T>(x.data<T>(), y.data<T>(), outer, n, inner, log); });
}

void softmax_backward_kernel(const char* op, const Tensor& grad, const Tensor& y, const Tensor& grad_x, int64_t outer,
                             int64_t n, int64_t inner, bool log) {
#if LOCKSTEP_HAVE_CUDA
  if (y.device().is_cuda()) {
    lockstep::cuda::OnDevice on(y.device());
    ops::dispatch_float(op, y.dtype(), [&]<typename T>() {
      ops::cuda::softmax_backward<T>(grad.data_ptr<T>(), y.data_ptr<T>(), grad_x.data_ptr<T>(), outer, n, inner, log,
                                     on.stream());
    });
    return;
  }
#endif
  ops::dispatch_float(op, y.dtype(), [&]<typename T>() {
    cpu::softmax_backward<T>(grad.data<T>(), y.data<T>(), grad_x.data<T>(), outer, n, inner, log);
  });
}

Tensor softmax_op(const char* op, const char* backward_name, const Tensor& x, int64_t axis, bool log) {
  ops::require_device(op, ops::common_device(op, {x}));
  ops::require_float(op, x);
  const int64_t rank = x.dim();
  const int64_t a = axis < 0 ? axis + rank : axis;
  LOCKSTEP_CHECK(a >= 0 && a < rank) << op << ": axis " << axis << " is out of range for a tensor of shape "
                                     << shape_str(x.shape()) << " (valid: "
                                     << (rank == 0 ? "none, it is 0-d"
                                                   : std::to_string(-rank) + " to " + std::to_string(rank - 1))
                                     << ")";
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < rank; ++i) {
    if (i < a) outer *= x.size(i);
    if (i > a) inner *= x.size(i);
  }
  const int64_t n = x.size(a);
  const Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  softmax_kernel(op, xc, y, outer, n, inner, log);
  if (!autograd::needs_grad({xc})) return y;
  autograd::record(backward_name, {xc}, {y},
                   [op, y_saved = y.detach(), outer, n, inner, log](const std::vector<Tensor>& g) {
                     const Tensor grad = g[0].contiguous();
                     Tensor grad_x = Tensor::empty(y_saved.shape(), y_saved.dtype(), y_saved.device());
                     softmax_backward_kernel(op, grad, y_saved, grad_x, outer, n, inner, log);
                     return std::vector<Tensor>{grad_x};
                   });
  return y;
}

// The CPU checks every label before the kernel runs.
void check_labels_on_host(const Tensor& lc, int64_t rows, int64_t classes) {
  ops::dispatch_index("cross_entropy", lc.dtype(), [&]<typename L>() {
    const L* l = lc.data<L>();
    for (int64_t i = 0; i < rows; ++i) {
      LOCKSTEP_CHECK(l[i] >= 0 && l[i] < classes)
          << "cross_entropy: label " << l[i] << " at position " << i << " is out of range for " << classes
          << " classes (valid: 0 to " << classes - 1 << ")";
    }
  });
}

void cross_entropy_cpu(const Tensor& xc, const Tensor& lc, Reduction reduction, const Tensor& losses, const Tensor& lse,
                       const Tensor& out) {
  const int64_t rows = xc.size(0), classes = xc.size(1);
  ops::dispatch_float("cross_entropy", xc.dtype(), [&]<typename T>() {
    ops::dispatch_index("cross_entropy", lc.dtype(), [&]<typename L>() {
      cpu::cross_entropy<T, L>(xc.data<T>(), lc.data<L>(), rows, classes, losses.data<T>(), lse.data<T>());
    });
    if (reduction != Reduction::none) {
      const T total = cpu::sum_contiguous(losses.data<T>(), rows);
      *out.data<T>() = reduction == Reduction::mean ? total / static_cast<T>(rows) : total;
    }
  });
}

void cross_entropy_backward_cpu(const Tensor& x_saved, const Tensor& lc, const Tensor& lse, const Tensor& grad,
                                Reduction reduction, const Tensor& grad_x) {
  const int64_t rows = x_saved.size(0), classes = x_saved.size(1);
  ops::dispatch_float("cross_entropy", x_saved.dtype(), [&]<typename T>() {
    // Per-row scale: the incoming gradient of that row's loss.
    T scalar = reduction == Reduction::none ? T(0) : *grad.data<T>();
    if (reduction == Reduction::mean) scalar /= static_cast<T>(rows);
    const T* scale = reduction == Reduction::none ? grad.data<T>() : &scalar;
    const int64_t stride = reduction == Reduction::none ? 1 : 0;
    ops::dispatch_index("cross_entropy", lc.dtype(), [&]<typename L>() {
      cpu::cross_entropy_backward<T, L>(x_saved.data<T>(), lc.data<L>(), lse.data<T>(), scale, stride, rows, classes,
                                        grad_x.data<T>());
    });
  });
}

#if LOCKSTEP_HAVE_CUDA
// The labels stay on the GPU: the forward kernel flags the first row whose label is out of
// range, and reading the flag back (which waits for the kernel) turns it into the CPU's error.
void cross_entropy_cuda(const Tensor& xc, const Tensor& lc, Reduction reduction, const Tensor& losses,
                        const Tensor& lse, const Tensor& out) {
  const int64_t rows = xc.size(0), classes = xc.size(1);
  const Tensor first_bad = Tensor::empty({1}, DType::i64, xc.device());
  {
    lockstep::cuda::OnDevice on(xc.device());
    ops::dispatch_float("cross_entropy", xc.dtype(), [&]<typename T>() {
      ops::dispatch_index("cross_entropy", lc.dtype(), [&]<typename L>() {
        ops::cuda::cross_entropy_forward<T, L>(xc.data_ptr<T>(), lc.data_ptr<L>(), rows, classes, losses.data_ptr<T>(),
                                               lse.data_ptr<T>(), first_bad.data_ptr<int64_t>(), on.stream());
      });
      if (reduction != Reduction::none) {
        ops::cuda::sum_losses<T>(losses.data_ptr<T>(), rows, reduction == Reduction::mean, out.data_ptr<T>(),
                                 on.stream());
      }
    });
  }
  const int64_t bad_row = first_bad.to_vector<int64_t>()[0];
  LOCKSTEP_CHECK(bad_row < 0) << "cross_entropy: label "
                              << lc.as_strided({1}, {1}, lc.offset() + bad_row).to_vector<int64_t>()[0]
                              << " at position " << bad_row << " is out of range for " << classes
                              << " classes (valid: 0 to " << classes - 1 << ")";
}

void cross_entropy_backward_cuda(const Tensor& x_saved, const Tensor& lc, const Tensor& lse, const Tensor& grad,
                                 Reduction reduction, const Tensor& grad_x) {
  const int64_t rows = x_saved.size(0), classes = x_saved.size(1);
  lockstep::cuda::OnDevice on(x_saved.device());
  ops::dispatch_float("cross_entropy", x_saved.dtype(), [&]<typename T>() {
    // Per-row scale: the incoming gradient of that row's loss (one value for a reduction).
    const int64_t stride = reduction == Reduction::none ? 1 : 0;
    const T divisor = reduction == Reduction::mean ? static_cast<T>(rows) : T(1);
    ops::dispatch_index("cross_entropy", lc.dtype(), [&]<typename L>() {
      ops::cuda::cross_entropy_backward<T, L>(x_saved.data_ptr<T>(), lc.data_ptr<L>(), lse.data_ptr<T>(),
                                              grad.data_ptr<T>(), stride, divisor, rows, classes, grad_x.data_ptr<T>(),
                                              on.stream());
    });
  });
}
#endif

}  // namespace

Tensor softmax(const Tensor& x, int64_t axis) { return softmax_op("softmax", "SoftmaxBackward", x, axis, false); }

Tensor log_softmax(const Tensor& x, int64_t axis) {
  return softmax_op("log_softmax", "LogSoftmaxBackward", x, axis, true);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, Reduction reduction) {
  const Device device = ops::common_device("cross_entropy", {logits, labels});
  ops::require_device("cross_entropy", device);
  ops::require_float("cross_entropy", logits);
  LOCKSTEP_CHECK(logits.dim() == 2) << "cross_entropy: logits must be [N, C] (a batch of class scores), got shape "
                                    << shape_str(logits.shape());
  const int64_t rows = logits.size(0), classes = logits.size(1);
  LOCKSTEP_CHECK(labels.dtype() == DType::i64 || labels.dtype() == DType::i32)
      << "cross_entropy: labels must be class indices of dtype i64 or i32, got " << dtype_name(labels.dtype());
  LOCKSTEP_CHECK(labels.dim() == 1 && labels.size(0) == rows)
      << "cross_entropy: labels must have shape [" << rows << "] to match logits " << shape_str(logits.shape())
      << ", got " << shape_str(labels.shape());
  const Tensor lc = labels.contiguous();
  if (device.is_cpu()) check_labels_on_host(lc, rows, classes);

  const Tensor xc = logits.contiguous();
  Tensor losses = Tensor::empty({rows}, logits.dtype(), device);
  Tensor lse = Tensor::empty({rows}, logits.dtype(), device);
  Tensor out = reduction == Reduction::none ? losses : Tensor::empty({}, logits.dtype(), device);
#if LOCKSTEP_HAVE_CUDA
  if (device.is_cuda()) {
    cross_entropy_cuda(xc, lc, reduction, losses, lse, out);
  } else {
    cross_entropy_cpu(xc, lc, reduction, losses, lse, out);
  }
#else
  cross_entropy_cpu(xc, lc, reduction, losses, lse, out);
#endif
  if (!autograd::needs_grad({xc})) return out;
  autograd::record("CrossEntropyBackward", {xc}, {out},
                   [x_saved = xc.detach(), lc, lse, reduction, rows, classes](const std::vector<Tensor>& g) {
                     const Tensor grad = g[0].contiguous();
                     Tensor grad_x = Tensor::empty({rows, classes}, x_saved.dtype(), x_saved.device());
#if LOCKSTEP_HAVE_CUDA
                     if (x_saved.device().is_cuda()) {
                       cross_entropy_backward_cuda(x_saved, lc, lse, grad, reduction, grad_x);
                       return std::vector<Tensor>{grad_x};
                     }
#endif
                     cross_entropy_backward_cpu(x_saved, lc, lse, grad, reduction, grad_x);
                     return std::vector<Tensor>{grad_x};
                   });
  return out;
}

}  // namespace lockstep
