#include <type_traits>

#include "lockstep/core/cuda/check.h"
#include "lockstep/core/cuda/copy_kernels.h"
#include "lockstep/core/error.h"
#include "lockstep/core/float_to_integer.h"
#include "lockstep/core/half_bits.h"

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
__device__ float load(const Bf16* p) { return half_bits::bf16_to_f32(p->bits); }
__device__ float load(const F16* p) { return half_bits::f16_to_f32(p->bits); }

// A value as the CPU's static_cast<float> makes it: a NaN double keeps its sign and top
// payload bits and turns quiet, as on x86 (the GPU's conversion gives the canonical NaN).
template <typename V>
__device__ float to_f32(V value) {
  return static_cast<float>(value);
}
__device__ float to_f32(double value) {
  if (value == value) return static_cast<float>(value);
  const auto bits = static_cast<unsigned long long>(__double_as_longlong(value));
  return __uint_as_float(static_cast<uint32_t>((bits >> 32) & 0x80000000u) | 0x7fc00000u |
                         static_cast<uint32_t>((bits >> 29) & 0x3fffffu));
}

// A float widened as the CPU's static_cast<double> does it (a NaN: sign and payload kept, quiet).
__device__ double to_f64(float value) {
  if (value == value) return static_cast<double>(value);
  const uint32_t bits = __float_as_uint(value) | 0x400000u;
  return __longlong_as_double(static_cast<long long>(static_cast<unsigned long long>(bits & 0x80000000u) << 32 |
                                                     0x7ff0000000000000ull |
                                                     static_cast<unsigned long long>(bits & 0x7fffffu) << 29));
}

template <typename Dst, typename V>
__device__ void store(Dst* p, V value) {
  if constexpr (std::is_integral_v<Dst> && std::is_floating_point_v<V>) {
    *p = float_to_integer<Dst>(value);  // the CPU's truncation and saturation, spelled out
  } else {
    *p = static_cast<Dst>(value);
  }
}
template <typename V>
__device__ void store(float* p, V value) {
  *p = to_f32(value);
}
__device__ void store(double* p, float value) { *p = to_f64(value); }
template <typename V>
__device__ void store(Bf16* p, V value) {
  p->bits = half_bits::f32_to_bf16(to_f32(value));
}
template <typename V>
__device__ void store(F16* p, V value) {
  p->bits = half_bits::f32_to_f16(to_f32(value));
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
  if (src.dtype == dst.dtype && (src.dtype == DType::bf16 || src.dtype == DType::f16)) {
    // The bits as they are, as the CPU copies them (through f32 a NaN could change).
    copy_kernel<uint16_t, uint16_t>
        <<<grid_for(n, kThreads), kThreads, 0, stream>>>(at<uint16_t>(src), at<uint16_t>(dst), layout, n);
    LOCKSTEP_CUDA_CHECK(cudaGetLastError());
    return;
  }
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
