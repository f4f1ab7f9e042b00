#include "lockstep/optim/adamw.h"

#include <cmath>

#include "lockstep/core/parallel.h"
#include "lockstep/ops/dispatch.h"
#include "lockstep/optim/flush_denormals.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/optim/cuda/optimizer_kernels.h"
#endif

namespace lockstep::optim {
namespace {

constexpr size_t kStepSlot = 0, kExpAvgSlot = 1, kExpAvgSqSlot = 2;

// Scalars as PyTorch computes them: in double (Python floats), rounded to T when they
// meet a tensor.
template <typename T>
struct AdamWScalars {
  T decay;          // 1 - lr * weight_decay
  T lerp_weight;    // exp_avg.lerp_(grad, 1 - beta1): coefficient and base as ATen's lerp
  bool lerp_small;  // |weight| < 0.5: m + w·(g - m), else g - (g - m)·(1 - w)
  T beta2;
  T one_minus_beta2;
  T bias_correction2_sqrt;
  T eps;
  T neg_step_size;  // -lr / bias_correction1
};

template <typename T, bool kDecay, bool kLerpSmall>
void adamw_loop(T* p, const T* g, T* m, T* v, int64_t begin, int64_t end, const AdamWScalars<T>& s) {
  const T coefficient = kLerpSmall ? s.lerp_weight : s.lerp_weight - T(1);
  for (int64_t i = begin; i < end; ++i) {
    T param = p[i];
    if constexpr (kDecay) param = param * s.decay;  // param.mul_(1 - lr * weight_decay)
    const T grad = g[i];
    const T avg = m[i];
    const T diff = grad - avg;
    const T new_avg = (kLerpSmall ? avg : grad) + coefficient * diff;  // exp_avg.lerp_(grad, 1 - beta1)
    T sq = v[i] * s.beta2;                                             // exp_avg_sq.mul_(beta2)
    sq = sq + s.one_minus_beta2 * grad * grad;                         // .addcmul_(grad, grad, 1 - beta2)
    const T denom = std::sqrt(sq) / s.bias_correction2_sqrt + s.eps;   // (sqrt(v) / bc2_sqrt).add_(eps)
    p[i] = param + s.neg_step_size * new_avg / denom;                  // param.addcdiv_(m, denom, -step_size)
    m[i] = new_avg;
    v[i] = sq;
  }
}

}  // namespace

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Optimizer(std::move(params), options.lr,
                {StateSlot{"step", false}, StateSlot{"exp_avg", true}, StateSlot{"exp_avg_sq", true}}),
      options_(options) {
  LOCKSTEP_CHECK(options.beta1 >= 0.0 && options.beta1 < 1.0 && options.beta2 >= 0.0 && options.beta2 < 1.0)
      << "AdamW: betas must be in [0, 1), got (" << options.beta1 << ", " << options.beta2 << ")";
  LOCKSTEP_CHECK(options.eps >= 0.0) << "AdamW: eps must be >= 0, got " << options.eps;
  LOCKSTEP_CHECK(options.weight_decay >= 0.0) << "AdamW: weight_decay must be >= 0, got " << options.weight_decay;
}

void AdamW::update(size_t index, const Tensor& param, const Tensor& grad) {
  Tensor& step_tensor = state_slot(index, kStepSlot);
  const Tensor exp_avg = state_slot(index, kExpAvgSlot);
  const Tensor exp_avg_sq = state_slot(index, kExpAvgSqSlot);
  const int64_t step = ++step_tensor.data<int64_t>()[0];  // on the host even for a GPU parameter

  const AdamWOptions& o = options_;
  const double bias_correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(o.beta2, static_cast<double>(step));
  const double step_size = lr_ / bias_correction1;
  const double lerp_weight = 1.0 - o.beta1;
  const bool decay = o.weight_decay != 0.0;
  const bool lerp_small = std::abs(lerp_weight) < 0.5;
  const int64_t n = param.numel();
  ops::dispatch_float("AdamW", param.dtype(), [&]<typename T>() {
    const AdamWScalars<T> s{static_cast<T>(1.0 - lr_ * o.weight_decay),
                            static_cast<T>(lerp_weight),
                            lerp_small,
                            static_cast<T>(o.beta2),
                            static_cast<T>(1.0 - o.beta2),
                            static_cast<T>(std::sqrt(bias_correction2)),
                            static_cast<T>(o.eps),
                            static_cast<T>(-step_size)};
#if LOCKSTEP_HAVE_CUDA
    if (param.device().is_cuda()) {
      const cuda::AdamWStep<T> step_scalars{.decay = s.decay,
                                            .lerp_weight = s.lerp_weight,
                                            .lerp_small = s.lerp_small,
                                            .use_decay = decay,
                                            .beta2 = s.beta2,
                                            .one_minus_beta2 = s.one_minus_beta2,
                                            .bias_correction2_sqrt = s.bias_correction2_sqrt,
                                            .eps = s.eps,
                                            .neg_step_size = s.neg_step_size};
      lockstep::cuda::OnDevice on(param.device());
      cuda::adamw_update(param.data_ptr<T>(), grad.data_ptr<T>(), exp_avg.data_ptr<T>(), exp_avg_sq.data_ptr<T>(), n,
                         step_scalars, on.stream());
      return;
    }
#endif
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* m = exp_avg.data<T>();
    T* v = exp_avg_sq.data<T>();
    parallel_for(n, kUpdateGrain, [&](int64_t begin, int64_t end) {
      const FlushDenormals flush;
      if (decay && lerp_small) {
        adamw_loop<T, true, true>(p, g, m, v, begin, end, s);
      } else if (decay) {
        adamw_loop<T, true, false>(p, g, m, v, begin, end, s);
      } else if (lerp_small) {
        adamw_loop<T, false, true>(p, g, m, v, begin, end, s);
      } else {
        adamw_loop<T, false, false>(p, g, m, v, begin, end, s);
      }
    });
  });
}

}  // namespace lockstep::optim
