// GPU kernels for softmax, log-softmax and the fused softmax cross-entropy, the CUDA side of
// ops/cpu/softmax.h with the same layouts and formulas. Every row sum is a fixed tree (lanes,
// then warps in order), and the batch loss sums rows in one block in a fixed order, so a
// result never depends on scheduling. Pointers are device pointers; work is queued on stream.
#pragma once

#include <cstdint>

struct CUstream_st;  // = cudaStream_t

namespace lockstep::ops::cuda {

// y = softmax (or log_softmax when take_log) of x along the middle axis of [outer, n, inner],
// with the row max subtracted first.
template <typename T>
void softmax_forward(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool take_log, CUstream_st* stream);

// grad_x from the output y: y · (grad - sum(grad · y)) for softmax, grad - e^y · sum(grad)
// for log_softmax, the sums along the same axis.
template <typename T>
void softmax_backward(const T* grad, const T* y, T* grad_x, int64_t outer, int64_t n, int64_t inner, bool take_log,
                      CUstream_st* stream);

// For each row i of logits [rows, classes]: lse[i] = log(sum_j e^logits[i, j]) and
// losses[i] = lse[i] - logits[i, labels[i]]. Labels are checked on the GPU: first_bad_row (one
// device int64) ends as -1 when every label is in [0, classes), else as the first row whose
// label is not (that row's loss is NaN); the caller reads it back and raises.
template <typename T, typename Label>
void cross_entropy_forward(const T* logits, const Label* labels, int64_t rows, int64_t classes, T* losses, T* lse,
                           int64_t* first_bad_row, CUstream_st* stream);

// out[0] = the sum of losses[0, rows), or that sum / rows when mean: one block, a fixed order.
template <typename T>
void sum_losses(const T* losses, int64_t rows, bool mean, T* out, CUstream_st* stream);

// grad[i, j] = (e^(logits[i, j] - lse[i]) - [j == labels[i]]) · scale[i · scale_stride] / divisor:
// softmax minus one-hot, scaled by the incoming gradient (divisor = rows for a mean, else 1).
// Labels must be in range (cross_entropy_forward checked them).
template <typename T, typename Label>
void cross_entropy_backward(const T* logits, const Label* labels, const T* lse, const T* scale, int64_t scale_stride,
                            T divisor, int64_t rows, int64_t classes, T* grad, CUstream_st* stream);

}  // namespace lockstep::ops::cuda
