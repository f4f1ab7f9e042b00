// conv2d on the CPU as im2col + GEMM over chunks of the batch. Chunks are sized so one
// chunk's column matrix and GEMM output stay in L2; threads take whole chunks and run
// single-threaded GEMMs on them. How the batch is cut depends only on the shapes, so every
// result (the weight gradient sums over chunks) is the same for any thread count.
#pragma once

#include <cstdint>

#include "lockstep/core/device.h"
#include "lockstep/ops/cpu/window2d.h"

namespace lockstep::cpu {

struct Conv2dShape {
  int64_t batch = 0, in_channels = 0, out_channels = 0;
  Window2d win;
  int64_t rows() const { return in_channels * win.kernel_area(); }  // C·KH·KW, the GEMM inner size
};

// The batch cut into `chunks` chunks of `samples` images (the last may hold fewer), as even
// as can be, so that one chunk's column matrix [C·KH·KW, samples·P] plus its GEMM output
// [O, samples·P] hold at most max_elements (one image per chunk when a single image holds
// more). The cut depends on the shape alone; an empty batch has no chunks.
struct BatchChunks {
  int64_t samples = 1, chunks = 0;
};
BatchChunks cut_batch(const Conv2dShape& s, int64_t max_elements);

// y[N, O, OH, OW] = conv(x[N, C, H, W], w[O, C, KH, KW]) + bias[O] (bias may be null).
// Workspace comes from `device`'s allocator.
template <typename T>
void conv2d_forward(const T* x, const T* w, const T* bias, T* y, const Conv2dShape& s, Device device);

// Gradients from dy[N, O, OH, OW]; each of dx, dw, db may be null (not wanted) and is
// overwritten otherwise.
template <typename T>
void conv2d_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, const Conv2dShape& s, Device device);

}  // namespace lockstep::cpu
