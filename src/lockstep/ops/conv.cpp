// conv2d: checks, then im2col + GEMM: the kernel of ops/cpu/conv2d on CPU devices, and on
// CUDA devices the same arrangement with the GPU's im2col (ops/cuda/conv_kernels) and cuBLAS
// (ops/cuda/gemm). Backward unfolds the input again rather than keeping the columns from
// forward (they are C·KH·KW times the input), and skips the input gradient when the input
// needs none (a network's first layer).
#include "lockstep/ops/conv.h"

#include <algorithm>

#include "lockstep/autograd/node.h"
#include "lockstep/ops/cpu/conv2d.h"
#include "lockstep/ops/dispatch.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/ops/cuda/conv_kernels.h"
#include "lockstep/ops/cuda/gemm.h"
#endif

namespace lockstep {
namespace {

template <typename T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

#if LOCKSTEP_HAVE_CUDA
template <typename T>
T* device_data_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// One chunk's column matrix and GEMM result hold at most this many elements (128 MiB of
// f32): large chunks keep the GEMMs wide.
constexpr int64_t kGpuChunkElements = int64_t{1} << 25;

// Per chunk: columns [K, count·P] = im2col(x), [O, count·P] = w[O, K] · columns, then to NCHW
// with the bias.
template <typename T>
void conv2d_forward_cuda(const T* x, const T* w, const T* bias, T* y, const cpu::Conv2dShape& s, Device device) {
  const cpu::BatchChunks cut = cpu::cut_batch(s, kGpuChunkElements);
  if (cut.chunks == 0) return;
  const int64_t K = s.rows(), O = s.out_channels, P = s.win.out_plane();
  const int64_t image = s.in_channels * s.win.in_plane();
  const Tensor col = Tensor::empty({K * cut.samples * P}, dtype_of<T>(), device);
  const Tensor mat = Tensor::empty({O * cut.samples * P}, dtype_of<T>(), device);
  cuda::OnDevice on(device);
  for (int64_t c = 0; c < cut.chunks; ++c) {
    const int64_t first = c * cut.samples, count = std::min(cut.samples, s.batch - first), ld = count * P;
    ops::cuda::im2col<T>(x + first * image, count, s.in_channels, s.win, col.data_ptr<T>(), ld, on.stream());
    ops::cuda::gemm<T>(false, false, O, ld, K, T(1), w, K, col.data_ptr<T>(), ld, T(0), mat.data_ptr<T>(), ld, device);
    ops::cuda::columns_to_nchw<T>(mat.data_ptr<T>(), bias, count, O, P, y + first * O * P, on.stream());
  }
}

// The bias gradient in one fixed-order reduction over the whole batch; per chunk, dy to
// [O, count·P], then dw (+)= dy · columnsᵀ (chunks accumulate in order on the stream: the
// first overwrites, the rest add) and columns = wᵀ · dy folded back by col2im into dx.
template <typename T>
void conv2d_backward_cuda(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, const cpu::Conv2dShape& s,
                          Device device) {
  const int64_t K = s.rows(), O = s.out_channels, P = s.win.out_plane();
  const int64_t image = s.in_channels * s.win.in_plane();
  cuda::OnDevice on(device);
  if (db != nullptr) ops::cuda::channel_sums<T>(dy, s.batch, O, P, db, on.stream());
  if (dw == nullptr && dx == nullptr) return;
  const cpu::BatchChunks cut = cpu::cut_batch(s, kGpuChunkElements);
  if (cut.chunks == 0) {
    if (dw != nullptr) LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(dw, 0, sizeof(T) * O * K, on.stream()));
    return;
  }
  const Tensor col = Tensor::empty({K * cut.samples * P}, dtype_of<T>(), device);
  const Tensor dyc = Tensor::empty({O * cut.samples * P}, dtype_of<T>(), device);
  for (int64_t c = 0; c < cut.chunks; ++c) {
    const int64_t first = c * cut.samples, count = std::min(cut.samples, s.batch - first), ld = count * P;
    ops::cuda::nchw_to_columns<T>(dy + first * O * P, count, O, P, dyc.data_ptr<T>(), on.stream());
    if (dw != nullptr) {
      ops::cuda::im2col<T>(x + first * image, count, s.in_channels, s.win, col.data_ptr<T>(), ld, on.stream());
      ops::cuda::gemm<T>(false, true, O, K, ld, T(1), dyc.data_ptr<T>(), ld, col.data_ptr<T>(), ld,
                         c == 0 ? T(0) : T(1), dw, K, device);
    }
    if (dx != nullptr) {
      ops::cuda::gemm<T>(true, false, K, ld, O, T(1), w, K, dyc.data_ptr<T>(), ld, T(0), col.data_ptr<T>(), ld, device);
      ops::cuda::col2im<T>(col.data_ptr<T>(), ld, count, s.in_channels, s.win, dx + first * image, on.stream());
    }
  }
}
#endif

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Pair stride, Pair padding) {
  const Device device = ops::common_device("conv2d", {x, weight, bias});
  ops::require_device("conv2d", device);
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
#if LOCKSTEP_HAVE_CUDA
    if (device.is_cuda()) {
      conv2d_forward_cuda<T>(xc.data_ptr<T>(), wc.data_ptr<T>(), device_data_or_null<T>(bc), out.data_ptr<T>(), s,
                             device);
      return;
    }
#endif
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
#if LOCKSTEP_HAVE_CUDA
                       if (x.device().is_cuda()) {
                         conv2d_backward_cuda<T>(x.data_ptr<T>(), w.data_ptr<T>(), grad.data_ptr<T>(),
                                                 device_data_or_null<T>(grad_x), device_data_or_null<T>(grad_w),
                                                 device_data_or_null<T>(grad_b), s, x.device());
                         return;
                       }
#endif
                       cpu::conv2d_backward<T>(x.data<T>(), w.data<T>(), grad.data<T>(), data_or_null<T>(grad_x),
                                               data_or_null<T>(grad_w), data_or_null<T>(grad_b), s, x.device());
                     });
                     return std::vector<Tensor>{grad_x, grad_w, grad_b};
                   });
  return out;
}

}  // namespace lockstep
