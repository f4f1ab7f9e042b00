// Element copies on a GPU between any two layouts and dtypes, with the CPU's conversion
// rules (core/dtype.h: a static_cast, the 16-bit floats through f32 rounded to nearest
// even), and fills. Callable from plain C++: pointers are device pointers.
#pragma once

#include <cstdint>

#include "lockstep/core/dtype.h"

struct CUstream_st;  // = cudaStream_t

namespace lockstep::cuda {

inline constexpr int kMaxCopyDims = 12;

// Where the elements of a tensor are: element i (in row-major order over shape) is at
// base + (offset + sum_k index_k * strides[k]) elements.
struct StridedView {
  void* base = nullptr;
  DType dtype = DType::f32;
  int64_t offset = 0;
  int64_t strides[kMaxCopyDims] = {};
};

// dst[i] = convert(src[i]) for the n elements of shape (rank dims, at most kMaxCopyDims).
void copy_elements(const StridedView& src, const StridedView& dst, const int64_t* shape, int rank, int64_t n,
                   CUstream_st* stream);
// dst[i] = value converted to dst's dtype, for the n elements of shape.
void fill_elements(const StridedView& dst, double value, const int64_t* shape, int rank, int64_t n,
                   CUstream_st* stream);

}  // namespace lockstep::cuda
