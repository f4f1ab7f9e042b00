// conv2d's GPU pieces around cuBLAS (ops/cuda/gemm.h): im2col / col2im with the layouts of
// ops/cpu/im2col.h, the moves between a GEMM's [O, count·P] result and NCHW (with the bias),
// and the bias gradient. Every output element is computed by one thread in a fixed order:
// no atomics, the same bits every run. Callable from plain C++: pointers are device pointers.
#pragma once

#include <cstdint>

#include "lockstep/ops/cpu/window2d.h"

struct CUstream_st;  // = cudaStream_t

namespace lockstep::ops::cuda {

// Unfolds `count` images x[count, channels, in_h, in_w] into col, a row-major
// [channels·KH·KW, ld] matrix: row (c·KH + kh)·KW + kw, column g·out_plane + oh·out_w + ow
// (columns past count·out_plane are left alone). Padding reads as zero.
template <typename T>
void im2col(const T* x, int64_t count, int64_t channels, const cpu::Window2d& win, T* col, int64_t ld,
            CUstream_st* stream);

// The adjoint: x[count, channels, in_h, in_w] (overwritten) = for each pixel, the sum of the
// column entries that read it, added in (kh, kw) order as ops/cpu/im2col.cpp does.
template <typename T>
void col2im(const T* col, int64_t ld, int64_t count, int64_t channels, const cpu::Window2d& win, T* x,
            CUstream_st* stream);

// y[g, o, p] = mat[o, g·plane + p] + bias[o] for g < count, o < channels, p < plane: a GEMM's
// [channels, count·plane] result (leading dimension count·plane) to NCHW. bias may be null.
template <typename T>
void columns_to_nchw(const T* mat, const T* bias, int64_t count, int64_t channels, int64_t plane, T* y,
                     CUstream_st* stream);

// The reverse move without a bias: mat[o, g·plane + p] = y[g, o, p].
template <typename T>
void nchw_to_columns(const T* y, int64_t count, int64_t channels, int64_t plane, T* mat, CUstream_st* stream);

// sums[o] = sum of y[g, o, p] over g < count and p < plane (the bias gradient): one block
// per channel, accumulated in double in a fixed order (strided per thread, then a tree).
template <typename T>
void channel_sums(const T* y, int64_t count, int64_t channels, int64_t plane, T* sums, CUstream_st* stream);

}  // namespace lockstep::ops::cuda
