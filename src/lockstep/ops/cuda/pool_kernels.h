// Max and average pooling on a GPU over independent H x W planes, with ops/cpu/pool.h's
// semantics: the same winner of each max window (the first maximum in row-major window
// order, NaN wins), the same argmax indices, zero padding counted in the average's divisor.
// Backward gathers: one thread per input pixel sums, in output order, the windows that
// cover it, so no two threads write one element and the sums have a fixed order. Callable
// from plain C++: pointers are device pointers.
#pragma once

#include <cstdint>

#include "lockstep/ops/cpu/window2d.h"

struct CUstream_st;  // = cudaStream_t

namespace lockstep::ops::cuda {

// y[planes, out_h, out_w] and argmax (the winner's ih·in_w + iw in its plane).
template <typename T>
void max_pool2d_forward(const T* x, int64_t planes, const cpu::Window2d& win, T* y, int32_t* argmax,
                        CUstream_st* stream);

// dx[planes, in_h, in_w] (overwritten): each pixel's sum of the dy whose argmax it is.
template <typename T>
void max_pool2d_backward(const T* dy, const int32_t* argmax, int64_t planes, const cpu::Window2d& win, T* dx,
                         CUstream_st* stream);

template <typename T>
void avg_pool2d_forward(const T* x, int64_t planes, const cpu::Window2d& win, T* y, CUstream_st* stream);

// dx (overwritten): each pixel's sum of dy / (kernel_h·kernel_w) over the windows covering it.
template <typename T>
void avg_pool2d_backward(const T* dy, int64_t planes, const cpu::Window2d& win, T* dx, CUstream_st* stream);

}  // namespace lockstep::ops::cuda
