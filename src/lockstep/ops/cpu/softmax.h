// CPU kernels for softmax, log-softmax and the fused softmax cross-entropy. Rows are
// independent tasks and every row sum has a fixed order, so threads never change a result.
#pragma once

#include <cstdint>

namespace lockstep::cpu {

// y = softmax (or log_softmax when `log`) of x along the middle axis of [outer, n, inner],
// with the row max subtracted first.
template <typename T>
void softmax(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log);

// grad_x from the output y: y · (grad - sum(grad · y)) for softmax, grad - e^y · sum(grad)
// for log_softmax, the sums along the same axis.
template <typename T>
void softmax_backward(const T* grad, const T* y, T* grad_x, int64_t outer, int64_t n, int64_t inner, bool log);

// For each row i of logits [rows, classes]: lse[i] = log(sum_j e^logits[i, j]) and
// losses[i] = lse[i] - logits[i, labels[i]]. Labels must already be in [0, classes).
template <typename T, typename Label>
void cross_entropy(const T* logits, const Label* labels, int64_t rows, int64_t classes, T* losses, T* lse);

// grad[i, j] = (e^(logits[i, j] - lse[i]) - [j == labels[i]]) · scale[i · scale_stride]:
// softmax minus one-hot, scaled by the incoming gradient (and 1/rows for a mean).
template <typename T, typename Label>
void cross_entropy_backward(const T* logits, const Label* labels, const T* lse, const T* scale, int64_t scale_stride,
                            int64_t rows, int64_t classes, T* grad);

}  // namespace lockstep::cpu
