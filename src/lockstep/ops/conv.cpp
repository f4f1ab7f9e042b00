// conv2d: checks, then the im2col + GEMM kernel of ops/cpu/conv2d. Backward unfolds the
// input again rather than keeping the columns from forward (they are C·KH·KW times the
// input), and skips the input gradient when the input needs none (a network's first layer).
#include "lockstep/ops/conv.h"

#include "lockstep/autograd/node.h"
#include "lockstep/ops/cpu/conv2d.h"
#include "lockstep/ops/dispatch.h"

namespace lockstep {
namespace {

template <typename T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Pair stride, Pair padding) {
  const Device device = ops::common_device("conv2d", {x, weight, bias});
  ops::require_cpu("conv2d", device);
  ops::require_float("conv2d", x);
  LOCKSTEP_CHECK(x.dim() == 4) << "conv2d: input must be [N, C, H, W], got shape " << shape_str(x.shape());
  LOCKSTEP_CHECK(weight.dim() == 4) << "conv2d: weight must be [out_channels, in_channels, KH, KW], got shape "
                                    << shape_str(weight.shape());
  LOCKSTEP_CHECK(weight.dtype() == x.dtype())
      << "conv2d: input is " << dtype_name(x.dtype()) << " but weight is " << dtype_name(weight.dtype());
  LOCKSTEP_CHECK(weight.size(1) == x.size(1))
      << "conv2d: weight " << shape_str(weight.shape()) << " expects " << weight.size(1)
      << " input channels but the input " << shape_str(x.shape()) << " has " << x.size(1);
  LOCKSTEP_CHECK(x.size(1) > 0 && weight.size(0) > 0)
      << "conv2d: channel counts must be positive, got input " << shape_str(x.shape()) << " and weight "
      << shape_str(weight.shape());
  const int64_t out_channels = weight.size(0);
  if (bias.defined()) {
    LOCKSTEP_CHECK(bias.dim() == 1 && bias.size(0) == out_channels && bias.dtype() == x.dtype())
        << "conv2d: bias must be [" << out_channels << "] of " << dtype_name(x.dtype()) << ", got "
        << shape_str(bias.shape()) << " " << dtype_name(bias.dtype());
  }
  cpu::Conv2dShape s;
  s.batch = x.size(0);
  s.in_channels = x.size(1);
  s.out_channels = out_channels;
  s.win = cpu::make_window2d("conv2d", x.size(2), x.size(3), weight.size(2), weight.size(3), stride[0], stride[1],
                             padding[0], padding[1]);

  const Tensor xc = x.contiguous(), wc = weight.contiguous();
  const Tensor bc = bias.defined() ? bias.contiguous() : bias;
  Tensor out = Tensor::empty({s.batch, out_channels, s.win.out_h, s.win.out_w}, x.dtype(), device);
  ops::dispatch_float("conv2d", x.dtype(), [&]<typename T>() {
    cpu::conv2d_forward<T>(xc.data<T>(), wc.data<T>(), data_or_null<T>(bc), out.data<T>(), s, device);
  });

  autograd::record("Conv2dBackward", {xc, wc, bc}, {out},
                   [x = xc.detach(), w = wc.detach(), s, need_x = xc.requires_grad(), need_w = wc.requires_grad(),
                    need_b = bc.defined() && bc.requires_grad()](const std::vector<Tensor>& g) {
                     const Tensor grad = g[0].contiguous();
                     Tensor grad_x, grad_w, grad_b;
                     if (need_x) grad_x = Tensor::empty(x.shape(), x.dtype(), x.device());
                     if (need_w) grad_w = Tensor::empty(w.shape(), w.dtype(), w.device());
                     if (need_b) grad_b = Tensor::empty({s.out_channels}, w.dtype(), w.device());
                     ops::dispatch_float("conv2d", x.dtype(), [&]<typename T>() {
                       cpu::conv2d_backward<T>(x.data<T>(), w.data<T>(), grad.data<T>(), data_or_null<T>(grad_x),
                                               data_or_null<T>(grad_w), data_or_null<T>(grad_b), s, x.device());
                     });
                     return std::vector<Tensor>{grad_x, grad_w, grad_b};
                   });
  return out;
}

}  // namespace lockstep
