// GPU kernels for layer normalization over rows of `dim` contiguous elements, the CUDA side of
// ops/norm.cpp: the same f64 statistics and closed-form backward. Row sums are fixed trees;
// the weight and bias gradients sum fixed chunks of rows into partials, then the partials in
// chunk order (no atomics), so results never depend on scheduling. Pointers are device
// pointers; work is queued on stream.
#pragma once

#include <cstdint>

struct CUstream_st;  // = cudaStream_t

namespace lockstep::ops::cuda {

// y = (x - mean) · rstd · w + b per row, with mean[r] and rstd[r] = 1 / sqrt(biased var + eps)
// computed and stored in f64. w and b may be null (absent).
template <typename T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, double* mean, double* rstd, int64_t rows, int64_t dim,
                        double eps, CUstream_st* stream);

// dx = rstd · (g - mean(g) - x̂ · mean(g · x̂)) per row, g = dy · w (dy when w is null).
template <typename T>
void layer_norm_backward_input(const T* x, const T* w, const T* dy, const double* mean, const double* rstd, T* dx,
                               int64_t rows, int64_t dim, CUstream_st* stream);

// The f64 elements of scratch layer_norm_backward_params needs: two [chunks, dim] partials,
// chunks fixed by rows alone.
int64_t layer_norm_params_scratch(int64_t rows, int64_t dim);

// dw[j] = sum_r dy[r, j] · x̂[r, j] and db[j] = sum_r dy[r, j], either may be null (not needed).
// scratch: layer_norm_params_scratch(rows, dim) doubles on the device.
template <typename T>
void layer_norm_backward_params(const T* x, const T* dy, const double* mean, const double* rstd, T* dw, T* db,
                                double* scratch, int64_t rows, int64_t dim, CUstream_st* stream);

}  // namespace lockstep::ops::cuda
