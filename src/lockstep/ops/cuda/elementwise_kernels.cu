#include <cuda_runtime.h>

#include <cstdint>

#include "lockstep/core/cuda/check.h"
#include "lockstep/core/error.h"
#include "lockstep/ops/cuda/elementwise_kernels.h"

namespace lockstep::ops::cuda {
namespace {

using lockstep::cuda::grid_for;

constexpr int kThreads = 256;
constexpr int kMaxDims = 12;

// ---- Broadcast layout: the output as nested loops over merged axes (ops/cpu/elementwise's
// merge_axes), with each operand's element stride along each axis (0 where it is broadcast).

struct Layout {
  int rank = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t a_strides[kMaxDims] = {};
  int64_t b_strides[kMaxDims] = {};
};

// Element strides of a contiguous operand of shape s, left-padded to rank, 0 on its size-1 axes.
void broadcast_strides(ShapeRef s, int rank, int64_t* strides) {
  for (int i = 0; i < rank; ++i) strides[i] = 0;
  int64_t stride = 1;
  for (int i = s.rank - 1; i >= 0; --i) {
    strides[i + rank - s.rank] = s.sizes[i] == 1 ? 0 : stride;
    stride *= s.sizes[i];
  }
}

// Size-1 axes are dropped, and an axis joins the one before it when, for both operands,
// stepping over it whole equals one step of the outer axis. Merging keeps kernels on one or
// two axes in the common cases (same shape, scalar, row and column operands).
Layout merge_axes(ShapeRef a, ShapeRef b, ShapeRef out) {
  const int rank = out.rank;
  LOCKSTEP_CHECK(a.rank <= rank && b.rank <= rank)
      << "elementwise: operand ranks " << a.rank << " and " << b.rank << " exceed the output's " << rank;
  constexpr int kMaxRank = 64;
  LOCKSTEP_CHECK(rank <= kMaxRank) << "elementwise: a tensor of rank " << rank << " is past the GPU kernels' "
                                   << kMaxRank << "; reshape it first";
  int64_t sa[kMaxRank], sb[kMaxRank];
  broadcast_strides(a, rank, sa);
  broadcast_strides(b, rank, sb);
  Layout layout;
  for (int i = 0; i < rank; ++i) {
    const int64_t size = out.sizes[i];
    if (size == 1) continue;
    const int last = layout.rank - 1;
    if (layout.rank > 0 && layout.a_strides[last] == sa[i] * size && layout.b_strides[last] == sb[i] * size) {
      layout.sizes[last] *= size;
      layout.a_strides[last] = sa[i];
      layout.b_strides[last] = sb[i];
    } else {
      LOCKSTEP_CHECK(layout.rank < kMaxDims)
          << "elementwise: broadcasting shapes that keep more than " << kMaxDims
          << " separate axes after merging is not supported on GPUs; reshape the operands first";
      layout.sizes[layout.rank] = size;
      layout.a_strides[layout.rank] = sa[i];
      layout.b_strides[layout.rank] = sb[i];
      ++layout.rank;
    }
  }
  if (layout.rank == 0) {
    layout.rank = 1;
    layout.sizes[0] = 1;
  }
  return layout;
}

// Index arithmetic in 32 bits when the loop can never pass 2^32 (integer division in 64
// bits costs several times more); offsets into an operand are below the output's size.
bool fits_32_bits(int64_t n) { return n < (int64_t{1} << 31); }

// ---- Operations.

struct Add {
  template <typename T>
  __device__ T operator()(T x, T y) const {
    return x + y;
  }
};
struct Sub {
  template <typename T>
  __device__ T operator()(T x, T y) const {
    return x - y;
  }
};
struct Mul {
  template <typename T>
  __device__ T operator()(T x, T y) const {
    return x * y;
  }
};
struct Div {
  template <typename T>
  __device__ T operator()(T x, T y) const {
    return x / y;
  }
};

// ---- Binary kernels, one per layout kind.

// Both operands have the output's shape.
template <typename F, typename T>
__global__ void binary_same_kernel(F f, const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                                   int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = f(a[i], b[i]);
}

// One operand is a single value: a_scalar says which.
template <typename F, typename T>
__global__ void binary_scalar_kernel(F f, const T* __restrict__ a, const T* __restrict__ b, bool a_scalar,
                                     T* __restrict__ out, int64_t n) {
  const T s = a_scalar ? *a : *b;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = a_scalar ? f(s, b[i]) : f(a[i], s);
}

// Any merged layout: each element's operand offsets from its index, innermost axis first.
template <typename Index, typename F, typename T>
__global__ void binary_strided_kernel(F f, const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                                      Layout layout, Index n) {
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    Index rest = i, oa = 0, ob = 0;
    for (int k = layout.rank - 1; k > 0; --k) {
      const Index size = static_cast<Index>(layout.sizes[k]);
      const Index index = rest % size;
      rest /= size;
      oa += index * static_cast<Index>(layout.a_strides[k]);
      ob += index * static_cast<Index>(layout.b_strides[k]);
    }
    oa += rest * static_cast<Index>(layout.a_strides[0]);
    ob += rest * static_cast<Index>(layout.b_strides[0]);
    out[i] = f(a[oa], b[ob]);
  }
}

template <typename F, typename T>
void launch_binary(F f, const T* a, ShapeRef a_shape, const T* b, ShapeRef b_shape, T* out, ShapeRef out_shape,
                   cudaStream_t stream) {
  int64_t n = 1;
  for (int i = 0; i < out_shape.rank; ++i) n *= out_shape.sizes[i];
  if (n == 0) return;
  const Layout layout = merge_axes(a_shape, b_shape, out_shape);
  const unsigned grid = grid_for(n, kThreads);
  if (layout.rank == 1 && layout.a_strides[0] == 1 && layout.b_strides[0] == 1) {
    binary_same_kernel<<<grid, kThreads, 0, stream>>>(f, a, b, out, n);
  } else if (layout.rank == 1 && layout.a_strides[0] + layout.b_strides[0] == 1) {  // strides 0 and 1
    binary_scalar_kernel<<<grid, kThreads, 0, stream>>>(f, a, b, layout.a_strides[0] == 0, out, n);
  } else if (fits_32_bits(n)) {
    binary_strided_kernel<uint32_t><<<grid, kThreads, 0, stream>>>(f, a, b, out, layout, static_cast<uint32_t>(n));
  } else {
    binary_strided_kernel<int64_t><<<grid, kThreads, 0, stream>>>(f, a, b, out, layout, n);
  }
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

// ---- Broadcast of one operand (strides in layout.a_strides).

template <typename Index, typename T>
__global__ void broadcast_kernel(const T* __restrict__ x, T* __restrict__ out, Layout layout, T scale, bool scaled,
                                 Index n) {
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    Index rest = i, offset = 0;
    for (int k = layout.rank - 1; k > 0; --k) {
      const Index size = static_cast<Index>(layout.sizes[k]);
      offset += rest % size * static_cast<Index>(layout.a_strides[k]);
      rest /= size;
    }
    offset += rest * static_cast<Index>(layout.a_strides[0]);
    const T v = x[offset];
    out[i] = scaled ? v * scale : v;
  }
}

// ---- Pointwise functions, in float and double. The float forms are CUDA's accurate
// library functions (erfcf, tanhf, expf, logf: a few ulp), not the fast intrinsics.

__device__ inline float erfc_of(float v) { return erfcf(v); }
__device__ inline double erfc_of(double v) { return erfc(v); }
__device__ inline float tanh_of(float v) { return tanhf(v); }
__device__ inline double tanh_of(double v) { return tanh(v); }
__device__ inline float exp_of(float v) { return expf(v); }
__device__ inline double exp_of(double v) { return exp(v); }
__device__ inline float log_of(float v) { return logf(v); }
__device__ inline double log_of(double v) { return log(v); }
__device__ inline float sqrt_of(float v) { return sqrtf(v); }
__device__ inline double sqrt_of(double v) { return sqrt(v); }

// Phi(x) = P(N(0,1) <= x) = erfc(-x / √2) / 2, the exact form the CPU computes.
template <typename T>
__device__ inline T normal_cdf(T x) {
  return T(0.5) * erfc_of(-x * T(0.707106781186547524));
}

// 1 / sqrt(2 pi): the standard normal density at 0.
template <typename T>
__device__ inline T inv_sqrt_2pi() {
  return T(0.398942280401432677939946059934);
}

struct Relu {
  template <typename T>
  __device__ T operator()(T v) const {
    return v < T(0) ? T(0) : v;  // nan stays nan
  }
};
struct Gelu {
  template <typename T>
  __device__ T operator()(T v) const {
    return v * normal_cdf(v);
  }
};
struct Tanh {
  template <typename T>
  __device__ T operator()(T v) const {
    return tanh_of(v);
  }
};
struct Exp {
  template <typename T>
  __device__ T operator()(T v) const {
    return exp_of(v);
  }
};
struct Log {
  template <typename T>
  __device__ T operator()(T v) const {
    return log_of(v);
  }
};
struct Sqrt {
  template <typename T>
  __device__ T operator()(T v) const {
    return sqrt_of(v);
  }
};
struct Square {
  template <typename T>
  __device__ T operator()(T v) const {
    return v * v;
  }
};

// Derivatives as grad · f'(·), from the saved output y or input x (cpu::unary_backward).
struct ReluBackward {  // saved y: y > 0 exactly where x > 0, and relu'(0) = 0
  template <typename T>
  __device__ T operator()(T g, T y) const {
    return y > T(0) ? g : T(0);
  }
};
struct GeluBackward {  // d/dx x·Phi(x) = Phi(x) + x·phi(x)
  template <typename T>
  __device__ T operator()(T g, T x) const {
    return g * (normal_cdf(x) + x * inv_sqrt_2pi<T>() * exp_of(T(-0.5) * x * x));
  }
};
struct TanhBackward {
  template <typename T>
  __device__ T operator()(T g, T y) const {
    return g * (T(1) - y * y);
  }
};
struct ExpBackward {
  template <typename T>
  __device__ T operator()(T g, T y) const {
    return g * y;
  }
};
struct LogBackward {
  template <typename T>
  __device__ T operator()(T g, T x) const {
    return g / x;
  }
};
struct SqrtBackward {
  template <typename T>
  __device__ T operator()(T g, T y) const {
    return g / (T(2) * y);
  }
};
struct SquareBackward {
  template <typename T>
  __device__ T operator()(T g, T x) const {
    return T(2) * x * g;
  }
};

struct AddScalar {
  template <typename T>
  __device__ T operator()(T v, T, T beta) const {
    return v + beta;
  }
};
struct MulScalar {
  template <typename T>
  __device__ T operator()(T v, T alpha, T) const {
    return alpha * v;
  }
};
struct MulAddScalar {
  template <typename T>
  __device__ T operator()(T v, T alpha, T beta) const {
    return alpha * v + beta;
  }
};

template <typename F, typename T>
__global__ void map_kernel(F f, const T* __restrict__ x, T* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = f(x[i]);
}

template <typename F, typename T>
__global__ void map2_kernel(F f, const T* __restrict__ g, const T* __restrict__ s, T* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = f(g[i], s[i]);
}

template <typename F, typename T>
__global__ void affine_kernel(F f, const T* __restrict__ x, T alpha, T beta, T* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = f(x[i], alpha, beta);
}

template <typename F, typename T>
void launch_map(F f, const T* x, T* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  map_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(f, x, out, n);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename F, typename T>
void launch_map2(F f, const T* g, const T* s, T* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  map2_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(f, g, s, out, n);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename F, typename T>
void launch_affine(F f, const T* x, T alpha, T beta, T* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  affine_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(f, x, alpha, beta, out, n);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <typename T>
void binary(BinaryOp op, const T* a, ShapeRef a_shape, const T* b, ShapeRef b_shape, T* out, ShapeRef out_shape,
            CUstream_st* stream) {
  switch (op) {
    case BinaryOp::add:
      return launch_binary(Add{}, a, a_shape, b, b_shape, out, out_shape, stream);
    case BinaryOp::sub:
      return launch_binary(Sub{}, a, a_shape, b, b_shape, out, out_shape, stream);
    case BinaryOp::mul:
      return launch_binary(Mul{}, a, a_shape, b, b_shape, out, out_shape, stream);
    case BinaryOp::div:
      return launch_binary(Div{}, a, a_shape, b, b_shape, out, out_shape, stream);
  }
}

template <typename T>
void broadcast_to(const T* x, ShapeRef x_shape, T* out, ShapeRef out_shape, T scale, CUstream_st* stream) {
  int64_t n = 1;
  for (int i = 0; i < out_shape.rank; ++i) n *= out_shape.sizes[i];
  if (n == 0) return;
  const Layout layout = merge_axes(x_shape, x_shape, out_shape);
  const bool scaled = scale != T(1);
  if (fits_32_bits(n)) {
    broadcast_kernel<uint32_t>
        <<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, out, layout, scale, scaled, static_cast<uint32_t>(n));
  } else {
    broadcast_kernel<int64_t><<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, out, layout, scale, scaled, n);
  }
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void affine(const T* x, T alpha, T beta, T* out, int64_t n, CUstream_st* stream) {
  // The common cases exactly as written (x + beta, alpha * x), signed zeros included.
  if (alpha == T(1)) {
    launch_affine(AddScalar{}, x, alpha, beta, out, n, stream);
  } else if (beta == T(0)) {
    launch_affine(MulScalar{}, x, alpha, beta, out, n, stream);
  } else {
    launch_affine(MulAddScalar{}, x, alpha, beta, out, n, stream);
  }
}

template <typename T>
void unary(UnaryOp op, const T* x, T* out, int64_t n, CUstream_st* stream) {
  switch (op) {
    case UnaryOp::relu:
      return launch_map(Relu{}, x, out, n, stream);
    case UnaryOp::gelu:
      return launch_map(Gelu{}, x, out, n, stream);
    case UnaryOp::tanh:
      return launch_map(Tanh{}, x, out, n, stream);
    case UnaryOp::exp:
      return launch_map(Exp{}, x, out, n, stream);
    case UnaryOp::log:
      return launch_map(Log{}, x, out, n, stream);
    case UnaryOp::sqrt:
      return launch_map(Sqrt{}, x, out, n, stream);
    case UnaryOp::square:
      return launch_map(Square{}, x, out, n, stream);
  }
}

template <typename T>
void unary_backward(UnaryOp op, const T* grad, const T* saved, T* grad_x, int64_t n, CUstream_st* stream) {
  switch (op) {
    case UnaryOp::relu:
      return launch_map2(ReluBackward{}, grad, saved, grad_x, n, stream);
    case UnaryOp::gelu:
      return launch_map2(GeluBackward{}, grad, saved, grad_x, n, stream);
    case UnaryOp::tanh:
      return launch_map2(TanhBackward{}, grad, saved, grad_x, n, stream);
    case UnaryOp::exp:
      return launch_map2(ExpBackward{}, grad, saved, grad_x, n, stream);
    case UnaryOp::log:
      return launch_map2(LogBackward{}, grad, saved, grad_x, n, stream);
    case UnaryOp::sqrt:
      return launch_map2(SqrtBackward{}, grad, saved, grad_x, n, stream);
    case UnaryOp::square:
      return launch_map2(SquareBackward{}, grad, saved, grad_x, n, stream);
  }
}

#define LOCKSTEP_INSTANTIATE(T)                                                                          \
  template void binary<T>(BinaryOp, const T*, ShapeRef, const T*, ShapeRef, T*, ShapeRef, CUstream_st*); \
  template void broadcast_to<T>(const T*, ShapeRef, T*, ShapeRef, T, CUstream_st*);                      \
  template void affine<T>(const T*, T, T, T*, int64_t, CUstream_st*);                                    \
  template void unary<T>(UnaryOp, const T*, T*, int64_t, CUstream_st*);                                  \
  template void unary_backward<T>(UnaryOp, const T*, const T*, T*, int64_t, CUstream_st*);
LOCKSTEP_INSTANTIATE(float)
LOCKSTEP_INSTANTIATE(double)
#undef LOCKSTEP_INSTANTIATE

}  // namespace lockstep::ops::cuda
