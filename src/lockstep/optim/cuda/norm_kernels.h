// Gradient clipping's work on a GPU: the sum of squares of a gradient in double, in a
// fixed order (per-block partials, then one ordered pass over them; the grid depends only
// on the element count), and the in-place scaling. Callable from plain C++: pointers are
// device pointers.
#pragma once

#include <cstdint>

struct CUstream_st;  // = cudaStream_t

namespace lockstep::optim::cuda {

// Doubles of scratch that sum_of_squares needs for n elements (0 when it needs none).
int64_t sum_of_squares_scratch(int64_t n);

// *out = the sum over i in [0, n) of double(x[i])², the same bits for the same n and data
// on the same GPU model. scratch holds sum_of_squares_scratch(n) doubles (may be null when
// that is 0). Queued on stream.
template <typename T>
void sum_of_squares(const T* x, int64_t n, double* scratch, double* out, CUstream_st* stream);

// x[i] = x[i] * factor for i in [0, n); queued on stream.
template <typename T>
void scale_elements(T* x, int64_t n, T factor, CUstream_st* stream);

}  // namespace lockstep::optim::cuda
