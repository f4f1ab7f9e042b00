// The optimizers' elementwise updates on a GPU: one fused kernel per optimizer, each
// element updated by one thread with the same operations, in the same order and dtype, as
// the CPU loops of sgd.cpp and adamw.cpp (so the two agree to rounding, and a GPU run does
// not depend on the launch size). Callable from plain C++: pointers are device pointers.
#pragma once

#include <cstdint>

struct CUstream_st;  // = cudaStream_t

namespace lockstep::optim::cuda {

// torch.optim.SGD's update, sgd.cpp's sgd_loop: the scalars already rounded to T.
template <typename T>
struct SgdStep {
  T weight_decay;
  T momentum;
  T one_minus_dampening;
  T neg_lr;
  bool decay;         // weight_decay != 0
  bool use_momentum;  // momentum != 0: buffer is the momentum buffer, else unused
  bool first;         // the buffer's first step: it starts as the gradient
  bool nesterov;
};

// param[i] (and buffer[i] with momentum) for i in [0, n), from grad; queued on stream.
template <typename T>
void sgd_update(T* param, const T* grad, T* buffer, int64_t n, const SgdStep<T>& step, CUstream_st* stream);

// torch.optim.AdamW's update, adamw.cpp's adamw_loop: the scalars already rounded to T.
template <typename T>
struct AdamWStep {
  T decay;          // 1 - lr * weight_decay
  T lerp_weight;    // 1 - beta1
  bool lerp_small;  // |lerp_weight| < 0.5 picks ATen's lerp formula
  bool use_decay;   // weight_decay != 0
  T beta2;
  T one_minus_beta2;
  T bias_correction2_sqrt;
  T eps;
  T neg_step_size;  // -lr / bias_correction1
};

// param, exp_avg and exp_avg_sq for i in [0, n), from grad; queued on stream.
template <typename T>
void adamw_update(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n, const AdamWStep<T>& step,
                  CUstream_st* stream);

}  // namespace lockstep::optim::cuda
