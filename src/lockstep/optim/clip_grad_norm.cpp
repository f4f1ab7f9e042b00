#include "lockstep/optim/clip_grad_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/core/cuda_device.h"
#include "lockstep/core/parallel.h"
#include "lockstep/ops/dispatch.h"
#include "lockstep/optim/optimizer.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/optim/cuda/norm_kernels.h"
#endif

namespace lockstep::optim {
namespace {

// Partial sums over chunks of this many elements, added in chunk order: the same answer
// for any thread count.
constexpr int64_t kNormChunk = int64_t{1} << 14;

Tensor dense_grad(const Tensor& param, size_t index) {
  const Tensor g = param.grad();
  if (!g.defined()) return g;
  LOCKSTEP_CHECK(g.device().is_cpu() || (g.device().is_cuda() && lockstep::cuda::built()))
      << "clip_grad_norm: gradient of parameter " << index << " is on " << g.device()
      << ", and this build has no CUDA backend to clip it there (built when nvcc and NCCL are found)";
  if (g.is_contiguous()) return g;
  Tensor dense = Tensor::empty(g.shape(), g.dtype(), g.device());
  dense.copy_from(g);
  return dense;
}

template <typename T>
double sum_of_squares(const T* x, int64_t n) {
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  parallel_for(chunks, std::max<int64_t>(1, kUpdateGrain / kNormChunk), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t lo = c * kNormChunk, hi = std::min(n, lo + kNormChunk);
      double s = 0.0;
      for (int64_t i = lo; i < hi; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
      partial[static_cast<size_t>(c)] = s;
    }
  });
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

#if LOCKSTEP_HAVE_CUDA
// Sums of squares of the gradients on GPUs: each parameter's sum is queued into its slot of
// a per-device f64 vector, and read back once per device at the end, so clipping waits for
// each GPU once rather than once per parameter.
class DeviceSums {
 public:
  explicit DeviceSums(size_t params) : params_(params) {}

  // Queues parameter `index`'s sum of squares of g (contiguous, on a GPU).
  void add(size_t index, const Tensor& g) {
    const Device device = g.device();
    Tensor& sums = sums_for(device);
    lockstep::cuda::OnDevice on(device);
    const int64_t scratch_size = cuda::sum_of_squares_scratch(g.numel());
    // Released on return while the kernels are queued: the allocator reuses its memory only
    // for later work on this device's stream.
    const Tensor scratch = scratch_size > 0 ? Tensor::empty({scratch_size}, DType::f64, device) : Tensor();
    double* scratch_ptr = scratch.defined() ? scratch.data_ptr<double>() : nullptr;
    double* out = sums.data_ptr<double>() + index;
    ops::dispatch_float("clip_grad_norm", g.dtype(), [&]<typename T>() {
      cuda::sum_of_squares(g.data_ptr<T>(), g.numel(), scratch_ptr, out, on.stream());
    });
    owner_.emplace_back(index, device);
  }

  // Writes every queued sum into sums[index].
  void collect(std::vector<double>& sums) const {
    for (const auto& [device, values] : devices_) {
      const std::vector<double> host = values.to_vector<double>();
      for (const auto& [index, owner] : owner_)
        if (owner == device) sums[index] = host[index];
    }
  }

 private:
  Tensor& sums_for(Device device) {
    for (auto& [d, t] : devices_)
      if (d == device) return t;
    devices_.emplace_back(device, Tensor::empty({static_cast<int64_t>(params_)}, DType::f64, device));
    return devices_.back().second;
  }

  size_t params_;
  std::vector<std::pair<Device, Tensor>> devices_;
  std::vector<std::pair<size_t, Device>> owner_;
};
#endif

}  // namespace

double grad_norm(const std::vector<Tensor>& params) {
  // Each parameter's sum of squares, added in parameter order below whatever its device.
  std::vector<double> sums(params.size(), 0.0);
  std::vector<bool> has_grad(params.size(), false);
#if LOCKSTEP_HAVE_CUDA
  DeviceSums device_sums(params.size());
#endif
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor g = dense_grad(params[i], i);
    if (!g.defined()) continue;
    has_grad[i] = true;
#if LOCKSTEP_HAVE_CUDA
    if (g.device().is_cuda()) {
      device_sums.add(i, g);
      continue;
    }
#endif
    ops::dispatch_float("clip_grad_norm", g.dtype(),
                        [&]<typename T>() { sums[i] = sum_of_squares(g.data<T>(), g.numel()); });
  }
#if LOCKSTEP_HAVE_CUDA
  device_sums.collect(sums);
#endif
  double total = 0.0;
  for (size_t i = 0; i < params.size(); ++i)
    if (has_grad[i]) total += sums[i];
  return std::sqrt(total);
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, bool error_if_nonfinite) {
  LOCKSTEP_CHECK(max_norm > 0) << "clip_grad_norm: max_norm must be positive, got " << max_norm;
  const double norm = grad_norm(params);
  LOCKSTEP_CHECK(std::isfinite(norm) || !error_if_nonfinite)
      << "clip_grad_norm: the total gradient norm is " << norm
      << " (a NaN or infinite gradient); lower the learning rate or check the loss";
  const double coefficient = max_norm / (norm + 1e-6);
  if (!(coefficient < 1.0) && std::isfinite(norm)) return norm;
  NoGradGuard no_grad;
  for (const Tensor& param : params) {
    const Tensor g = param.grad();
    if (!g.defined()) continue;
    Tensor dense = g;
    if (!g.is_contiguous()) {
      dense = Tensor::empty(g.shape(), g.dtype(), g.device());
      dense.copy_from(g);
    }
    ops::dispatch_float("clip_grad_norm", g.dtype(), [&]<typename T>() {
      const T scale = static_cast<T>(coefficient);
#if LOCKSTEP_HAVE_CUDA
      if (dense.device().is_cuda()) {
        lockstep::cuda::OnDevice on(dense.device());
        cuda::scale_elements(dense.data_ptr<T>(), dense.numel(), scale, on.stream());
        return;
      }
#endif
      T* x = dense.data<T>();
      parallel_for(dense.numel(), kUpdateGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) x[i] = x[i] * scale;
      });
    });
    if (!dense.is_same(g)) g.copy_from(dense);
  }
  return norm;
}

}  // namespace lockstep::optim
