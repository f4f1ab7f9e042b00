// Softmax, log-softmax and cross-entropy: argument checks, the CPU kernels of ops/cpu/softmax,
// and backward functions computed directly from the saved output (no chain of generic ops).
#include "lockstep/ops/loss.h"

#include <string>

#include "lockstep/autograd/node.h"
#include "lockstep/ops/cpu/reduce.h"
#include "lockstep/ops/cpu/softmax.h"
#include "lockstep/ops/dispatch.h"

namespace lockstep {
namespace {

Tensor softmax_op(const char* op, const char* backward_name, const Tensor& x, int64_t axis, bool log) {
  ops::require_cpu(op, ops::common_device(op, {x}));
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
  ops::dispatch_float(op, x.dtype(),
                      [&]<typename T>() { cpu::softmax<T>(xc.data<T>(), y.data<T>(), outer, n, inner, log); });
  if (!autograd::needs_grad({xc})) return y;
  autograd::record(
      backward_name, {xc}, {y}, [op, y_saved = y.detach(), outer, n, inner, log](const std::vector<Tensor>& g) {
        const Tensor grad = g[0].contiguous();
        Tensor grad_x = Tensor::empty(y_saved.shape(), y_saved.dtype(), y_saved.device());
        ops::dispatch_float(op, y_saved.dtype(), [&]<typename T>() {
          cpu::softmax_backward<T>(grad.data<T>(), y_saved.data<T>(), grad_x.data<T>(), outer, n, inner, log);
        });
        return std::vector<Tensor>{grad_x};
      });
  return y;
}

// Calls body.template operator()<L>() with L the C++ type of the label dtype (i32 or i64).
template <typename Body>
void dispatch_label(DType dtype, Body&& body) {
  if (dtype == DType::i64) {
    body.template operator()<int64_t>();
  } else {
    body.template operator()<int32_t>();
  }
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t axis) { return softmax_op("softmax", "SoftmaxBackward", x, axis, false); }

Tensor log_softmax(const Tensor& x, int64_t axis) {
  return softmax_op("log_softmax", "LogSoftmaxBackward", x, axis, true);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, Reduction reduction) {
  const Device device = ops::common_device("cross_entropy", {logits, labels});
  ops::require_cpu("cross_entropy", device);
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
  dispatch_label(lc.dtype(), [&]<typename L>() {
    const L* l = lc.data<L>();
    for (int64_t i = 0; i < rows; ++i) {
      LOCKSTEP_CHECK(l[i] >= 0 && l[i] < classes)
          << "cross_entropy: label " << l[i] << " at position " << i << " is out of range for " << classes
          << " classes (valid: 0 to " << classes - 1 << ")";
    }
  });

  const Tensor xc = logits.contiguous();
  Tensor losses = Tensor::empty({rows}, logits.dtype(), device);
  Tensor lse = Tensor::empty({rows}, logits.dtype(), device);
  Tensor out = reduction == Reduction::none ? losses : Tensor::empty({}, logits.dtype(), device);
  ops::dispatch_float("cross_entropy", logits.dtype(), [&]<typename T>() {
    dispatch_label(lc.dtype(), [&]<typename L>() {
      cpu::cross_entropy<T, L>(xc.data<T>(), lc.data<L>(), rows, classes, losses.data<T>(), lse.data<T>());
    });
    if (reduction != Reduction::none) {
      const T total = cpu::sum_contiguous(losses.data<T>(), rows);
      *out.data<T>() = reduction == Reduction::mean ? total / static_cast<T>(rows) : total;
    }
  });
  if (!autograd::needs_grad({xc})) return out;
  autograd::record("CrossEntropyBackward", {xc}, {out},
                   [x_saved = xc.detach(), lc, lse, reduction, rows, classes](const std::vector<Tensor>& g) {
                     const Tensor grad = g[0].contiguous();
                     Tensor grad_x = Tensor::empty({rows, classes}, x_saved.dtype(), x_saved.device());
                     ops::dispatch_float("cross_entropy", x_saved.dtype(), [&]<typename T>() {
                       // Per-row scale: the incoming gradient of that row's loss.
                       T scalar = reduction == Reduction::none ? T(0) : *grad.data<T>();
                       if (reduction == Reduction::mean) scalar /= static_cast<T>(rows);
                       const T* scale = reduction == Reduction::none ? grad.data<T>() : &scalar;
                       const int64_t stride = reduction == Reduction::none ? 1 : 0;
                       dispatch_label(lc.dtype(), [&]<typename L>() {
                         cpu::cross_entropy_backward<T, L>(x_saved.data<T>(), lc.data<L>(), lse.data<T>(), scale,
                                                           stride, rows, classes, grad_x.data<T>());
                       });
                     });
                     return std::vector<Tensor>{grad_x};
                   });
  return out;
}

}  // namespace lockstep
