// max_pool2d and avg_pool2d over [N, C, H, W] (or [C, H, W]): each H x W plane is pooled
// on its own, in parallel over planes (ops/cpu/pool on CPU devices, ops/cuda/pool_kernels on
// CUDA devices, with the same winners and argmax indices).
#include "lockstep/ops/cpu/pool.h"

#include "lockstep/autograd/node.h"
#include "lockstep/ops/conv.h"
#include "lockstep/ops/dispatch.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/ops/cuda/pool_kernels.h"
#endif

namespace lockstep {
namespace {

struct PoolSetup {
  Tensor input;  // contiguous
  cpu::Window2d win;
  int64_t planes = 0;
  Shape out_shape;
};

PoolSetup setup_pool(const char* op, const Tensor& x, Pair kernel, Pair stride, Pair padding) {
  const Device device = ops::common_device(op, {x});
  ops::require_device(op, device);
  ops::require_float(op, x);
  LOCKSTEP_CHECK(x.dim() == 4 || x.dim() == 3)
      << op << ": input must be [N, C, H, W] or [C, H, W], got shape " << shape_str(x.shape());
  const int64_t stride_h = stride[0] == 0 ? kernel[0] : stride[0];
  const int64_t stride_w = stride[1] == 0 ? kernel[1] : stride[1];
  PoolSetup s;
  s.win =
      cpu::make_window2d(op, x.size(-2), x.size(-1), kernel[0], kernel[1], stride_h, stride_w, padding[0], padding[1]);
  // Also what keeps every max-pooling window over at least one real pixel.
  LOCKSTEP_CHECK(2 * padding[0] <= kernel[0] && 2 * padding[1] <= kernel[1])
      << op << ": padding (" << padding[0] << ", " << padding[1] << ") must be at most half the kernel (" << kernel[0]
      << ", " << kernel[1] << ")";
  LOCKSTEP_CHECK(s.win.in_plane() < (int64_t{1} << 31))
      << op << ": planes of " << s.win.in_h << "x" << s.win.in_w << " pixels are too large (at most 2^31 per plane)";
  s.input = x.contiguous();
  s.planes = x.numel() / std::max<int64_t>(s.win.in_plane(), 1);
  s.out_shape = x.shape();
  s.out_shape[s.out_shape.size() - 2] = s.win.out_h;
  s.out_shape.back() = s.win.out_w;
  return s;
}

}  // namespace

Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding) {
  const PoolSetup s = setup_pool("max_pool2d", x, kernel, stride, padding);
  Tensor out = Tensor::empty(s.out_shape, x.dtype(), x.device());
  const Tensor argmax = Tensor::empty(s.out_shape, DType::i32, x.device());
  ops::dispatch_float("max_pool2d", x.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
    if (x.device().is_cuda()) {
      cuda::OnDevice on(x.device());
      ops::cuda::max_pool2d_forward<T>(s.input.data_ptr<T>(), s.planes, s.win, out.data_ptr<T>(),
                                       argmax.data_ptr<int32_t>(), on.stream());
      return;
    }
#endif
    cpu::max_pool2d_forward<T>(s.input.data<T>(), s.planes, s.win, out.data<T>(), argmax.data<int32_t>());
  });
  autograd::record("MaxPool2dBackward", {s.input}, {out},
                   [argmax, win = s.win, planes = s.planes, in_shape = s.input.shape()](const std::vector<Tensor>& g) {
                     const Tensor grad = g[0].contiguous();
                     Tensor grad_x = Tensor::empty(in_shape, grad.dtype(), grad.device());
                     ops::dispatch_float("max_pool2d", grad.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
                       if (grad.device().is_cuda()) {
                         cuda::OnDevice on(grad.device());
                         ops::cuda::max_pool2d_backward<T>(grad.data_ptr<T>(), argmax.data_ptr<int32_t>(), planes, win,
                                                           grad_x.data_ptr<T>(), on.stream());
                         return;
                       }
#endif
                       cpu::max_pool2d_backward<T>(grad.data<T>(), argmax.data<int32_t>(), planes, win,
                                                   grad_x.data<T>());
                     });
                     return std::vector<Tensor>{grad_x};
                   });
  return out;
}

Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding) {
  const PoolSetup s = setup_pool("avg_pool2d", x, kernel, stride, padding);
  Tensor out = Tensor::empty(s.out_shape, x.dtype(), x.device());
  ops::dispatch_float("avg_pool2d", x.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
    if (x.device().is_cuda()) {
      cuda::OnDevice on(x.device());
      ops::cuda::avg_pool2d_forward<T>(s.input.data_ptr<T>(), s.planes, s.win, out.data_ptr<T>(), on.stream());
      return;
    }
#endif
    cpu::avg_pool2d_forward<T>(s.input.data<T>(), s.planes, s.win, out.data<T>());
  });
  autograd::record("AvgPool2dBackward", {s.input}, {out},
                   [win = s.win, planes = s.planes, in_shape = s.input.shape()](const std::vector<Tensor>& g) {
                     const Tensor grad = g[0].contiguous();
                     Tensor grad_x = Tensor::empty(in_shape, grad.dtype(), grad.device());
                     ops::dispatch_float("avg_pool2d", grad.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
                       if (grad.device().is_cuda()) {
                         cuda::OnDevice on(grad.device());
                         ops::cuda::avg_pool2d_backward<T>(grad.data_ptr<T>(), planes, win, grad_x.data_ptr<T>(),
                                                           on.stream());
                         return;
                       }
#endif
                       cpu::avg_pool2d_backward<T>(grad.data<T>(), planes, win, grad_x.data<T>());
                     });
                     return std::vector<Tensor>{grad_x};
                   });
  return out;
}

}  // namespace lockstep
