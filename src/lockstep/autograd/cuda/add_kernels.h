// Gradient sums on a GPU: out = left + right, element by element, in the element dtype.
// Backward accumulates a node's incoming gradients and a leaf's .grad with it, and the
// gradient tree (parallel/gradient_tree) folds micro-batches with it: the same operand order
// and rounding as the CPU's `d[i] += p[i]` and tree_reduce's two-way sum (f32, f64).
// Callable from plain C++: pointers are device pointers.
#pragma once

#include <cstdint>

#include "lockstep/core/dtype.h"

struct CUstream_st;  // = cudaStream_t

namespace lockstep::autograd::cuda {

// out[i] = left[i] + right[i] for i in [0, n), elements of dtype f32 or f64. out may be left
// or right itself (each element is read before it is written); other overlaps are not
// allowed. Queued on stream. Returns false, queueing nothing, for any other dtype.
bool add_elements(const void* left, const void* right, void* out, int64_t n, DType dtype, CUstream_st* stream);

}  // namespace lockstep::autograd::cuda
