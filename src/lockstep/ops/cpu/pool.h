// Max and average pooling kernels over independent H x W planes (one plane per sample and
// channel). Max pooling records which input won each window so backward can route gradients.
#pragma once

#include <cstdint>

#include "lockstep/ops/cpu/window2d.h"

namespace lockstep::cpu {

// y[planes, out_h, out_w]; argmax holds, per output, the winning index ih·in_w + iw in its
// plane. Padding never wins (every window holds at least one real pixel); NaN wins, as in PyTorch.
template <typename T>
void max_pool2d_forward(const T* x, int64_t planes, const Window2d& win, T* y, int32_t* argmax);

// dx (overwritten) receives each dy at its argmax; ties in a window went to the first maximum.
template <typename T>
void max_pool2d_backward(const T* dy, const int32_t* argmax, int64_t planes, const Window2d& win, T* dx);

// Mean over each window with zero padding counted in the divisor (kernel_h·kernel_w).
template <typename T>
void avg_pool2d_forward(const T* x, int64_t planes, const Window2d& win, T* y);

// dx (overwritten): each dy spread evenly over its window's real pixels.
template <typename T>
void avg_pool2d_backward(const T* dy, int64_t planes, const Window2d& win, T* dx);

}  // namespace lockstep::cpu
