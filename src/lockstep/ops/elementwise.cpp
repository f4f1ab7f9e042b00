// Elementwise ops: argument checks, the kernels of ops/cpu/elementwise (and, on GPUs,
// ops/cuda/elementwise_kernels), and backward functions. A broadcast operand's gradient is
// summed back to its shape with sum_to.
#include "lockstep/ops/elementwise.h"

#include "lockstep/autograd/node.h"
#include "lockstep/ops/cpu/elementwise.h"
#include "lockstep/ops/dispatch.h"
#include "lockstep/ops/reduce.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/ops/cuda/elementwise_kernels.h"
#endif

namespace lockstep {
namespace {

#if LOCKSTEP_HAVE_CUDA
ops::cuda::ShapeRef shape_ref(const Shape& shape) { return {shape.data(), static_cast<int>(shape.size())}; }

// The kernels' enums repeat the CPU's in the same order, so a cast maps one onto the other.
static_assert(static_cast<int>(ops::cuda::BinaryOp::add) == static_cast<int>(cpu::BinaryOp::add) &&
              static_cast<int>(ops::cuda::BinaryOp::sub) == static_cast<int>(cpu::BinaryOp::sub) &&
              static_cast<int>(ops::cuda::BinaryOp::mul) == static_cast<int>(cpu::BinaryOp::mul) &&
              static_cast<int>(ops::cuda::BinaryOp::div) == static_cast<int>(cpu::BinaryOp::div));
static_assert(static_cast<int>(ops::cuda::UnaryOp::relu) == static_cast<int>(cpu::UnaryOp::relu) &&
              static_cast<int>(ops::cuda::UnaryOp::gelu) == static_cast<int>(cpu::UnaryOp::gelu) &&
              static_cast<int>(ops::cuda::UnaryOp::tanh) == static_cast<int>(cpu::UnaryOp::tanh) &&
              static_cast<int>(ops::cuda::UnaryOp::exp) == static_cast<int>(cpu::UnaryOp::exp) &&
              static_cast<int>(ops::cuda::UnaryOp::log) == static_cast<int>(cpu::UnaryOp::log) &&
              static_cast<int>(ops::cuda::UnaryOp::sqrt) == static_cast<int>(cpu::UnaryOp::sqrt) &&
              static_cast<int>(ops::cuda::UnaryOp::square) == static_cast<int>(cpu::UnaryOp::square));

ops::cuda::BinaryOp cuda_op(cpu::BinaryOp op) { return static_cast<ops::cuda::BinaryOp>(op); }
ops::cuda::UnaryOp cuda_op(cpu::UnaryOp op) { return static_cast<ops::cuda::UnaryOp>(op); }
#endif

// Checks two operands of a binary op (device, dtype, broadcastable shapes) and returns the
// output shape.
Shape check_binary(const char* op, const Tensor& a, const Tensor& b) {
  const Device device = ops::common_device(op, {a, b});
  ops::require_device(op, device);
  LOCKSTEP_CHECK(a.dtype() == b.dtype()) << op << ": dtypes differ (" << dtype_name(a.dtype()) << " and "
                                         << dtype_name(b.dtype())
                                         << "); convert one with .to(DType::" << dtype_name(a.dtype()) << ")";
  ops::require_float(op, a);
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  const size_t rank = std::max(sa.size(), sb.size());
  for (size_t i = 1; i <= rank; ++i) {  // from the last axis
    const int64_t da = i <= sa.size() ? sa[sa.size() - i] : 1;
    const int64_t db = i <= sb.size() ? sb[sb.size() - i] : 1;
    LOCKSTEP_CHECK(da == db || da == 1 || db == 1)
        << op << ": shapes " << shape_str(sa) << " and " << shape_str(sb) << " cannot be broadcast together (axis -"
        << i << " is " << da << " against " << db << "; each axis, aligned from the last, must match or be 1)";
  }
  return broadcast_shapes(sa, sb);
}

Tensor binary_forward(const char* op, cpu::BinaryOp kind, const Tensor& a, const Tensor& b, const Tensor& out) {
  ops::dispatch_float(op, a.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
    if (out.device().is_cuda()) {
      const lockstep::cuda::OnDevice on(out.device());
      ops::cuda::binary<T>(cuda_op(kind), a.data_ptr<T>(), shape_ref(a.shape()), b.data_ptr<T>(), shape_ref(b.shape()),
                           out.data_ptr<T>(), shape_ref(out.shape()), on.stream());
      return;
    }
#endif
    cpu::binary<T>(kind, a.data<T>(), a.shape(), b.data<T>(), b.shape(), out.data<T>(), out.shape());
  });
  return out;
}

Tensor binary_op(const char* op, cpu::BinaryOp kind, const Tensor& a, const Tensor& b) {
  const Shape shape = check_binary(op, a, b);
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  binary_forward(op, kind, ac, bc, out);
  if (!autograd::needs_grad({ac, bc})) return out;
  // Backward runs with grad mode off, so it may use the public ops without recording.
  const bool need_a = ac.requires_grad(), need_b = bc.requires_grad();
  const Shape a_shape = ac.shape(), b_shape = bc.shape();
  switch (kind) {
    case cpu::BinaryOp::add:
      autograd::record("AddBackward", {ac, bc}, {out}, [=](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{need_a ? sum_to(g[0], a_shape) : Tensor(),
                                   need_b ? sum_to(g[0], b_shape) : Tensor()};
      });
      break;
    case cpu::BinaryOp::sub:
      autograd::record("SubBackward", {ac, bc}, {out}, [=](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{need_a ? sum_to(g[0], a_shape) : Tensor(),
                                   need_b ? neg(sum_to(g[0], b_shape)) : Tensor()};
      });
      break;
    case cpu::BinaryOp::mul:
      autograd::record("MulBackward", {ac, bc}, {out},
                       [=, a_saved = need_b ? ac.detach() : Tensor(),
                        b_saved = need_a ? bc.detach() : Tensor()](const std::vector<Tensor>& g) {
                         return std::vector<Tensor>{need_a ? sum_to(mul(g[0], b_saved), a_shape) : Tensor(),
                                                    need_b ? sum_to(mul(g[0], a_saved), b_shape) : Tensor()};
                       });
      break;
    case cpu::BinaryOp::div:
      // d(a/b)/da = 1/b and d(a/b)/db = -a/b² = -(1/b)·(a/b): both start from q = g / b.
      autograd::record(
          "DivBackward", {ac, bc}, {out},
          [=, quotient = need_b ? out.detach() : Tensor(), b_saved = bc.detach()](const std::vector<Tensor>& g) {
            const Tensor q = div(g[0], b_saved);
            return std::vector<Tensor>{need_a ? sum_to(q, a_shape) : Tensor(),
                                       need_b ? neg(sum_to(mul(q, quotient), b_shape)) : Tensor()};
          });
      break;
  }
  return out;
}

// out = alpha * x + beta, whose gradient is alpha * grad.
Tensor affine_op(const char* op, const char* backward_name, const Tensor& x, double alpha, double beta) {
  const Device device = ops::common_device(op, {x});
  ops::require_device(op, device);
  ops::require_float(op, x);
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
  ops::dispatch_float(op, x.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
    if (device.is_cuda()) {
      const lockstep::cuda::OnDevice on(device);
      ops::cuda::affine<T>(xc.data_ptr<T>(), static_cast<T>(alpha), static_cast<T>(beta), out.data_ptr<T>(), xc.numel(),
                           on.stream());
      return;
    }
#endif
    cpu::affine<T>(xc.data<T>(), static_cast<T>(alpha), static_cast<T>(beta), out.data<T>(), xc.numel());
  });
  autograd::record(backward_name, {xc}, {out}, [alpha](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{alpha == 1.0 ? g[0] : mul(g[0], alpha)};
  });
  return out;
}

Tensor unary_op(const char* op, const char* backward_name, cpu::UnaryOp kind, const Tensor& x) {
  const Device device = ops::common_device(op, {x});
  ops::require_device(op, device);
  ops::require_float(op, x);
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
  ops::dispatch_float(op, x.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
    if (device.is_cuda()) {
      const lockstep::cuda::OnDevice on(device);
      ops::cuda::unary<T>(cuda_op(kind), xc.data_ptr<T>(), out.data_ptr<T>(), xc.numel(), on.stream());
      return;
    }
#endif
    cpu::unary<T>(kind, xc.data<T>(), out.data<T>(), xc.numel());
  });
  if (!autograd::needs_grad({xc})) return out;
  const Tensor saved = cpu::backward_uses_output(kind) ? out.detach() : xc.detach();
  autograd::record(backward_name, {xc}, {out}, [op, kind, saved](const std::vector<Tensor>& g) {
    const Tensor grad = g[0].contiguous();
    Tensor grad_x = Tensor::empty(saved.shape(), saved.dtype(), saved.device());
    ops::dispatch_float(op, saved.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
      if (saved.device().is_cuda()) {
        const lockstep::cuda::OnDevice on(saved.device());
        ops::cuda::unary_backward<T>(cuda_op(kind), grad.data_ptr<T>(), saved.data_ptr<T>(), grad_x.data_ptr<T>(),
                                     saved.numel(), on.stream());
        return;
      }
#endif
      cpu::unary_backward<T>(kind, grad.data<T>(), saved.data<T>(), grad_x.data<T>(), saved.numel());
    });
    return std::vector<Tensor>{grad_x};
  });
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary_op("add", cpu::BinaryOp::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op("sub", cpu::BinaryOp::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op("mul", cpu::BinaryOp::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op("div", cpu::BinaryOp::div, a, b); }

Tensor add(const Tensor& a, double b) { return affine_op("add", "AddScalarBackward", a, 1.0, b); }
Tensor mul(const Tensor& a, double b) { return affine_op("mul", "MulScalarBackward", a, b, 0.0); }
Tensor neg(const Tensor& x) { return affine_op("neg", "NegBackward", x, -1.0, 0.0); }

Tensor relu(const Tensor& x) { return unary_op("relu", "ReluBackward", cpu::UnaryOp::relu, x); }
Tensor gelu(const Tensor& x) { return unary_op("gelu", "GeluBackward", cpu::UnaryOp::gelu, x); }
Tensor tanh(const Tensor& x) { return unary_op("tanh", "TanhBackward", cpu::UnaryOp::tanh, x); }
Tensor exp(const Tensor& x) { return unary_op("exp", "ExpBackward", cpu::UnaryOp::exp, x); }
Tensor log(const Tensor& x) { return unary_op("log", "LogBackward", cpu::UnaryOp::log, x); }
Tensor sqrt(const Tensor& x) { return unary_op("sqrt", "SqrtBackward", cpu::UnaryOp::sqrt, x); }
Tensor square(const Tensor& x) { return unary_op("square", "SquareBackward", cpu::UnaryOp::square, x); }

}  // namespace lockstep
