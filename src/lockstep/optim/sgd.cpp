#include "lockstep/optim/sgd.h"

#include "lockstep/core/parallel.h"
#include "lockstep/ops/dispatch.h"
#include "lockstep/optim/flush_denormals.h"
#include "lockstep/optim/with_flag.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/optim/cuda/optimizer_kernels.h"
#endif

namespace lockstep::optim {
namespace {

constexpr size_t kMomentumSlot = 0;

// The update with its branches fixed at compile time, so the loop vectorizes. Operation
// order is PyTorch's single-tensor SGD, in T, with its scalars rounded to T first.
template <typename T, bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
void sgd_loop(T* p, const T* g, T* buf, int64_t begin, int64_t end, T weight_decay, T momentum, T one_minus_dampening,
              T neg_lr) {
  for (int64_t i = begin; i < end; ++i) {
    T d = g[i];
    if constexpr (kDecay) d = d + weight_decay * p[i];  // grad.add(param, alpha=weight_decay)
    if constexpr (kMomentum) {
      T b;
      if constexpr (kFirst) {
        b = d;  // buf = clone(grad)
      } else {
        b = buf[i] * momentum;  // buf.mul_(momentum).add_(grad, alpha=1 - dampening)
        b = b + one_minus_dampening * d;
      }
      buf[i] = b;
      if constexpr (kNesterov) {
        d = d + momentum * b;  // grad.add(buf, alpha=momentum)
      } else {
        d = b;
      }
    }
    p[i] = p[i] + neg_lr * d;  // param.add_(grad, alpha=-lr)
  }
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : Optimizer(std::move(params), options.lr, {StateSlot{"momentum_buffer", true}}), options_(options) {
  LOCKSTEP_CHECK(options.momentum >= 0.0) << "SGD: momentum must be >= 0, got " << options.momentum;
  LOCKSTEP_CHECK(options.weight_decay >= 0.0) << "SGD: weight_decay must be >= 0, got " << options.weight_decay;
  LOCKSTEP_CHECK(!options.nesterov || (options.momentum > 0.0 && options.dampening == 0.0))
      << "SGD: nesterov needs momentum > 0 and dampening 0, got momentum " << options.momentum << " and dampening "
      << options.dampening;
}

void SGD::update(size_t index, const Tensor& param, const Tensor& grad) {
  const bool decay = options_.weight_decay != 0.0;
  const bool use_momentum = options_.momentum != 0.0;
  const bool first = use_momentum && !has_state(index, kMomentumSlot);
  Tensor buf;
  if (use_momentum) buf = state_slot(index, kMomentumSlot);
  const int64_t n = param.numel();
#if LOCKSTEP_HAVE_CUDA
  if (param.device().is_cuda()) {
    lockstep::cuda::OnDevice on(param.device());
    ops::dispatch_float("SGD", param.dtype(), [&]<typename T>() {
      const cuda::SgdStep<T> step{.weight_decay = static_cast<T>(options_.weight_decay),
                                  .momentum = static_cast<T>(options_.momentum),
                                  .one_minus_dampening = static_cast<T>(1.0 - options_.dampening),
                                  .neg_lr = static_cast<T>(-lr_),
                                  .decay = decay,
                                  .use_momentum = use_momentum,
                                  .first = first,
                                  .nesterov = options_.nesterov};
      cuda::sgd_update(param.data_ptr<T>(), grad.data_ptr<T>(), use_momentum ? buf.data_ptr<T>() : nullptr, n, step,
                       on.stream());
    });
    return;
  }
#endif
  ops::dispatch_float("SGD", param.dtype(), [&]<typename T>() {
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* b = use_momentum ? buf.data<T>() : nullptr;
    const T weight_decay = static_cast<T>(options_.weight_decay);
    const T momentum = static_cast<T>(options_.momentum);
    const T one_minus_dampening = static_cast<T>(1.0 - options_.dampening);
    const T neg_lr = static_cast<T>(-lr_);
    with_flag(decay, [&](auto kDecay) {
      with_flag(use_momentum, [&](auto kMomentum) {
        with_flag(first, [&](auto kFirst) {
          with_flag(options_.nesterov, [&](auto kNesterov) {
            parallel_for(n, kUpdateGrain, [&](int64_t begin, int64_t end) {
              const FlushDenormals flush;
              sgd_loop<T, kDecay.value, kMomentum.value, kFirst.value, kNesterov.value>(
                  p, g, b, begin, end, weight_decay, momentum, one_minus_dampening, neg_lr);
            });
          });
        });
      });
    });
  });
}

}  // namespace lockstep::optim
