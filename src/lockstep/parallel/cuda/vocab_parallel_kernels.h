// The GPU side of vocab_parallel_cross_entropy (parallel/vocab_parallel.cpp): each rank's
// columns [first, first + columns) of f32 logits [rows, vocab], with the same formulas as the
// CPU path; every row sum is a fixed tree (row_reduce.cuh), so the results do not depend on
// scheduling. The all-reduces between the steps are the caller's. Pointers are device
// pointers; work is queued on stream. Callable from plain C++.
#pragma once

#include <cstdint>

struct CUstream_st;  // = cudaStream_t

namespace lockstep::parallel::cuda {

// row_max[i] = the largest of logits[i, 0 .. columns).
void vocab_row_max(const float* logits, int64_t rows, int64_t columns, float* row_max, CUstream_st* stream);

// With row_max the maxima over the whole vocabulary: exps[i, j] = e^(logits[i, j] - row_max[i]),
// sums[i] = Σ_j exps[i, j], and picked[i] = logits[i, t - first] - row_max[i] for the target
// t = targets[i] when this rank holds it, else 0.
void vocab_exp_sums(const float* logits, const int64_t* targets, int64_t rows, int64_t columns, int64_t first,
                    const float* row_max, float* exps, float* sums, float* picked, CUstream_st* stream);

// With sums and picked over the whole vocabulary: losses[i] = log(sums[i]) - picked[i], and
// exps becomes the probabilities exps / sums.
void vocab_losses(float* exps, const float* sums, const float* picked, int64_t rows, int64_t columns, float* losses,
                  CUstream_st* stream);

// grad[i, j] = (probabilities[i, j] - [j == targets[i] - first]) · upstream[i].
void vocab_gradient(const float* probabilities, const int64_t* targets, const float* upstream, int64_t rows,
                    int64_t columns, int64_t first, float* grad, CUstream_st* stream);

}  // namespace lockstep::parallel::cuda
