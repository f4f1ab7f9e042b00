// im2col / col2im for NCHW convolution: unfolding image patches into the columns of a matrix
// turns a convolution into one GEMM (weights [O, C·KH·KW] times columns [C·KH·KW, pixels]).
// col2im is the adjoint (sums columns back into images), used for the input gradient.
#pragma once

#include <cstdint>

#include "lockstep/ops/cpu/window2d.h"

namespace lockstep::cpu {

// Unfolds `count` consecutive images x[count, channels, in_h, in_w] into col, a row-major
// [channels·KH·KW, ld] matrix: row (c·KH + kh)·KW + kw, column g·out_plane + oh·out_w + ow.
// Padding reads as zero. Parallel over (image, channel); the result does not depend on threads.
template <typename T>
void im2col(const T* x, int64_t count, int64_t channels, const Window2d& win, T* col, int64_t ld);

// The adjoint: x[count, channels, in_h, in_w] = sum of the columns over every window position
// that reads each pixel (x is overwritten, not added to). Each pixel sums in a fixed order.
template <typename T>
void col2im(const T* col, int64_t ld, int64_t count, int64_t channels, const Window2d& win, T* x);

}  // namespace lockstep::cpu
