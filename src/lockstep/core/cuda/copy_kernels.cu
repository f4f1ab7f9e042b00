#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "lockstep/core/cuda/check.h"
#include "lockstep/core/cuda/copy_kernels.h"
#include "lockstep/core/error.h"

namespace lockstep::cuda {
namespace {

// Storage types: the 16-bit floats travel as their bits.
struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

// The value of an element as the CPU's convert_to reads it: 16-bit floats widen to f32.
template <typename T>
__device__ T load(const T* p) {
  return *p;
}
__device__ float load(const Bf16* p) { return __uint_as_float(static_cast<uint32_t>(p->bits) << 16); }
__device__ float load(const F16* p) { return __half2float(__ushort_as_half(p->bits)); }

// core/dtype.h's f32_to_bf16, bit for bit (a NaN stays a quiet NaN).
__device__ uint16_t to_bf16_bits(float value) {
  uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

template <typename Dst, typename V>
__device__ void store(Dst* p, V value) {
  *p = static_cast<Dst>(value);
}
template <typename V>
__device__ void store(Bf16* p, V value) {
  p->bits = to_bf16_bits(static_cast<float>(value));
}
template <typename V>
__device__ void store(F16* p, V value) {
  p->bits = __half_as_ushort(__float2half_rn(static_cast<float>(value)));
}

struct Layout {
  int rank;
  int64_t shape[kMaxCopyDims];
  int64_t src_strides[kMaxCopyDims];
  int64_t dst_strides[kMaxCopyDims];
};

template <typename Src, typename Dst>
__global__ void copy_kernel(const Src* src, Dst* dst, Layout layout, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i, s = 0, d = 0;
    for (int k = layout.rank - 1; k >= 0; --k) {
      const int64_t index = rest % layout.shape[k];
      rest /= layout.shape[k];
      s += index * layout.src_strides[k];
      d += index * layout.dst_strides[k];
    }
    store(dst + d, load(src + s));
  }
}

template <typename Dst>
__global__ void fill_kernel(Dst* dst, double value, Layout layout, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i, d = 0;
    for (int k = layout.rank - 1; k >= 0; --k) {
      d += rest % layout.shape[k] * layout.dst_strides[k];
      rest /= layout.shape[k];
    }
    store(dst + d, value);
  }
}

// Calls body(T{}) with the storage type of dtype.
template <typename Body>
void with_type(DType dtype, Body&& body) {
  switch (dtype) {
    case DType::f32:
      return body(float{});
    case DType::f64:
      return body(double{});
    case DType::bf16:
      return body(Bf16{});
    case DType::f16:
      return body(F16{});
    case DType::i32:
      return body(int32_t{});
    case DType::i64:
      return body(int64_t{});
    case DType::u8:
      return body(uint8_t{});
  }
}

template <typename T>
T* at(const StridedView& view) {
  return static_cast<T*>(view.base) + view.offset;
}

Layout make_layout(const int64_t* shape, int rank, const int64_t* src_strides, const int64_t* dst_strides) {
  LOCKSTEP_CHECK(rank <= kMaxCopyDims) << "a copy on a GPU handles at most " << kMaxCopyDims << " dimensions, not "
                                       << rank << "; reshape the tensor first";
  Layout layout{};
  layout.rank = rank;
  for (int k = 0; k < rank; ++k) {
    layout.shape[k] = shape[k];
    layout.src_strides[k] = src_strides ? src_strides[k] : 0;
    layout.dst_strides[k] = dst_strides[k];
  }
  return layout;
}

constexpr int kThreads = 256;

}  // namespace

void copy_elements(const StridedView& src, const StridedView& dst, const int64_t* shape, int rank, int64_t n,
                   CUstream_st* stream) {
  if (n == 0) return;
  const Layout layout = make_layout(shape, rank, src.strides, dst.strides);
  with_type(src.dtype, [&](auto s) {
    using Src = decltype(s);
    with_type(dst.dtype, [&](auto d) {
      using Dst = decltype(d);
      copy_kernel<Src, Dst><<<grid_for(n, kThreads), kThreads, 0, stream>>>(at<Src>(src), at<Dst>(dst), layout, n);
    });
  });
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

void fill_elements(const StridedView& dst, double value, const int64_t* shape, int rank, int64_t n,
                   CUstream_st* stream) {
  if (n == 0) return;
  const Layout layout = make_layout(shape, rank, nullptr, dst.strides);
  with_type(dst.dtype, [&](auto d) {
    using Dst = decltype(d);
    fill_kernel<Dst><<<grid_for(n, kThreads), kThreads, 0, stream>>>(at<Dst>(dst), value, layout, n);
  });
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lockstep::cuda
