#include "lockstep/ops/batch_norm_running_stats.h"

#include <cmath>
#include <vector>

#include "lockstep/ops/dispatch.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/ops/cuda/batch_norm_kernels.h"
#endif

namespace lockstep {
namespace {

// running = (1 - factor) · running + factor · (sum / forwards), per element in f64, rounded once
// to the buffer's dtype.
void fold_on_host(const Tensor& running, const Tensor& sum, double forwards, double factor) {
  const std::vector<double> sums = sum.to_vector<double>();
  ops::dispatch_float("BatchNorm", running.dtype(), [&]<typename T>() {
    T* r = running.data<T>();
    for (size_t c = 0; c < sums.size(); ++c) {
      r[c] = static_cast<T>((1.0 - factor) * static_cast<double>(r[c]) + factor * (sums[c] / forwards));
    }
  });
}

// The count, read where that costs no wait for a GPU, and checked.
double host_count(const Tensor& forwards, const char* who) {
  const double count = forwards.item();
  LOCKSTEP_CHECK(count >= 0 && std::isfinite(count))
      << who << ": step statistics count " << count << " forwards; expected a count >= 0";
  return count;
}

}  // namespace

void fold_batch_norm_running_stats(const Tensor& running_mean, const Tensor& running_var,
                                   const Tensor& num_batches_tracked, const Tensor& mean_sum, const Tensor& var_sum,
                                   const Tensor& forwards, std::optional<double> momentum, const char* who) {
  const Device device = running_mean.device();
  const int64_t channels = running_mean.numel();
  LOCKSTEP_CHECK(running_var.device() == device && num_batches_tracked.device() == device)
      << who << ": running_mean is on " << device << ", running_var on " << running_var.device()
      << " and num_batches_tracked on " << num_batches_tracked.device() << "; move the module with .to(device)";
  LOCKSTEP_CHECK(running_mean.dim() == 1 && running_var.shape() == running_mean.shape() &&
                 running_var.dtype() == running_mean.dtype() && running_mean.is_contiguous() &&
                 running_var.is_contiguous())
      << who << ": running_mean " << shape_str(running_mean.shape()) << " " << dtype_name(running_mean.dtype())
      << " and running_var " << shape_str(running_var.shape()) << " " << dtype_name(running_var.dtype())
      << " must be contiguous [C] tensors of one float dtype";
  LOCKSTEP_CHECK(num_batches_tracked.dtype() == DType::i64 && num_batches_tracked.numel() == 1)
      << who << ": num_batches_tracked must be one i64, got " << shape_str(num_batches_tracked.shape()) << " "
      << dtype_name(num_batches_tracked.dtype());
  LOCKSTEP_CHECK(mean_sum.numel() == channels && var_sum.numel() == channels && forwards.numel() == 1)
      << who << ": step statistics of " << mean_sum.numel() << " and " << var_sum.numel() << " channels and "
      << forwards.numel() << " counts for running statistics of " << channels << " channels; expected " << channels
      << ", " << channels << " and 1";
  const double factor_if_given = momentum ? *momentum : 0.0;

  if (device.is_cpu()) {
    const double count = host_count(forwards, who);
    if (count == 0) return;
    int64_t& tracked = num_batches_tracked.data<int64_t>()[0];
    tracked += 1;
    const double factor = momentum ? factor_if_given : 1.0 / static_cast<double>(tracked);
    fold_on_host(running_mean, mean_sum, count, factor);
    fold_on_host(running_var, var_sum, count, factor);
    return;
  }
  ops::require_device(who, device);
  if (forwards.device().is_cpu() && host_count(forwards, who) == 0) return;
#if LOCKSTEP_HAVE_CUDA
  const auto on_device_f64 = [device](const Tensor& t) { return t.to(device).to(DType::f64).contiguous(); };
  const Tensor means = on_device_f64(mean_sum), vars = on_device_f64(var_sum), count = on_device_f64(forwards);
  lockstep::cuda::OnDevice on(device);
  ops::dispatch_float(who, running_mean.dtype(), [&]<typename T>() {
    ops::cuda::batch_norm_fold_running_stats<T>(running_mean.data_ptr<T>(), running_var.data_ptr<T>(),
                                                num_batches_tracked.data_ptr<int64_t>(), means.data_ptr<double>(),
                                                vars.data_ptr<double>(), count.data_ptr<double>(), channels, !momentum,
                                                factor_if_given, on.stream());
  });
#endif
}

}  // namespace lockstep
