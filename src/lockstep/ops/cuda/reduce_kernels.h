// GPU reduction kernels over contiguous data (ops/cpu/reduce's functions on device
// pointers). Every sum is added in an order fixed by the shape alone: each thread adds a fixed
// set of terms in index order, warps and blocks combine them in fixed shared-memory trees,
// and long axes are cut into parts fixed by the shape whose sums a second pass adds in order.
// No atomics: the same input on the same GPU model gives the same bits every run.
// Callable from plain C++ (no CUDA headers needed).
#pragma once

#include <cstdint>

struct CUstream_st;  // = cudaStream_t

namespace lockstep::ops::cuda {

// Elements of scratch (of the data's type) that sum_middle needs for this shape; 0 when it
// runs in one pass.
int64_t sum_middle_workspace(int64_t outer, int64_t n, int64_t inner);

// x viewed as [outer, n, inner] summed over the middle axis into out [outer, inner] (zeros
// when n is 0). workspace holds sum_middle_workspace(outer, n, inner) elements (may be null
// when that is 0).
template <typename T>
void sum_middle(const T* x, int64_t outer, int64_t n, int64_t inner, T* out, T* workspace, CUstream_st* stream);

// x[i] /= divisor over n elements (a mean from a sum, divided as the CPU divides).
template <typename T>
void divide(T* x, int64_t n, T divisor, CUstream_st* stream);

// Max along the middle axis of [outer, n, inner] (n >= 1): the value (when values is not
// null) and the index of its first occurrence; a nan counts as the largest value and the
// first nan wins, as on the CPU.
template <typename T>
void max_middle(const T* x, int64_t outer, int64_t n, int64_t inner, T* values, int64_t* indices, CUstream_st* stream);

// The gradient of max_middle: grad_x [outer, n, inner] is grad [outer, inner] at the
// positions indices name along the middle axis, and 0 elsewhere.
template <typename T>
void max_backward(const T* grad, const int64_t* indices, int64_t outer, int64_t n, int64_t inner, T* grad_x,
                  CUstream_st* stream);

}  // namespace lockstep::ops::cuda
