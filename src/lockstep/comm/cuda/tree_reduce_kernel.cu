#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "lockstep/comm/cuda/tree_reduce_kernel.h"
#include "lockstep/comm/tree_reduce.h"
#include "lockstep/core/error.h"
#include "lockstep/core/half_bits.h"

namespace lockstep::comm::cuda {
namespace {

// bf16/f16 <-> f32 through core/half_bits.h, the CPU's own conversions: the
// NcclCommunicator kernel test compares this kernel with tree_reduce bit for bit, specials
// included.
using half_bits::bf16_to_f32;
using half_bits::f16_to_f32;
using half_bits::f32_to_bf16;
using half_bits::f32_to_f16;

// ---- the arithmetic of tree_reduce.cpp: storage type -> accumulation type and back ----

struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

// round(): a partial result rounded to the storage type's precision (rounded_sum).
template <typename T>
struct Accum {
  using type = T;
  __device__ static T load(T v) { return v; }
  __device__ static T store(T v) { return v; }
  __device__ static T round(T v) { return v; }
};
template <>
struct Accum<Bf16> {
  using type = float;
  __device__ static float load(Bf16 v) { return bf16_to_f32(v.bits); }
  __device__ static Bf16 store(float v) { return {f32_to_bf16(v)}; }
  __device__ static float round(float v) { return bf16_to_f32(f32_to_bf16(v)); }
};
template <>
struct Accum<F16> {
  using type = float;
  __device__ static float load(F16 v) { return f16_to_f32(v.bits); }
  __device__ static F16 store(float v) { return {f32_to_f16(v)}; }
  __device__ static float round(float v) { return f16_to_f32(f32_to_f16(v)); }
};

template <typename A>
__device__ A add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));  // wraps, as on the CPU
  } else {
    return a + b;
  }
}

// Operand order matters (NaN payloads, +0 vs -0): always combine(left subtree, right subtree).
template <typename A, ReduceOp op>
__device__ A combine(A a, A b) {
  if constexpr (op == ReduceOp::max) {
    return (a > b || a != a) ? a : b;
  } else if constexpr (op == ReduceOp::min) {
    return (a < b || a != a) ? a : b;
  } else {
    return add(a, b);
  }
}

// One node of the tree: combine, then round where rounded (rounded_sum).
template <typename T, ReduceOp op, bool rounded>
__device__ typename Accum<T>::type join(typename Accum<T>::type a, typename Accum<T>::type b) {
  const typename Accum<T>::type c = combine<typename Accum<T>::type, op>(a, b);
  if constexpr (rounded) return Accum<T>::round(c);
  return c;
}

// Deeper than any tree over an int count of leaves needs.
constexpr int kMaxDepth = 32;

// One thread per element. tree_reduce splits n leaves at the largest power of two p below
// n: a perfect tree over the first p, then the same rule on the rest. Reading the leaves
// left to right and merging the two top partials whenever they cover equal powers of two
// (a binary counter) builds exactly those perfect trees; what is left on the stack are the
// perfect trees of n's binary digits, largest first, which the split rule joins from the
// right: x[0..p) + (x[p..p+q) + (...)). The CPU fold of three leaves is (x0+x1)+x2; so is this.
template <typename T, ReduceOp op, bool rounded = false>
__global__ void fold_rows(const T* rows, int64_t row_stride, int n, T* out, int64_t count, bool average) {
  using A = typename Accum<T>::type;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += step) {
    A partial[kMaxDepth];
    int height[kMaxDepth];
    int top = 0;
    for (int k = 0; k < n; ++k) {
      A value = Accum<T>::load(rows[k * row_stride + i]);
      int h = 0;
      while (top > 0 && height[top - 1] == h) {
        value = join<T, op, rounded>(partial[top - 1], value);
        --top;
        ++h;
      }
      partial[top] = value;
      height[top] = h;
      ++top;
    }
    A result = partial[top - 1];
    for (int j = top - 2; j >= 0; --j) result = join<T, op, rounded>(partial[j], result);
    if constexpr (!std::is_integral_v<A>) {
      if (average) result = result / static_cast<A>(n);  // after the sum, in the accumulation type
    }
    out[i] = Accum<T>::store(result);
  }
}

template <typename T>
void launch(const void* rows, int64_t row_stride, int n, void* out, int64_t count, ReduceOp op, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((count + kThreads - 1) / kThreads, int64_t{1} << 16));
  const T* in = static_cast<const T*>(rows);
  T* o = static_cast<T*>(out);
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      fold_rows<T, ReduceOp::sum><<<blocks, kThreads, 0, stream>>>(in, row_stride, n, o, count, op == ReduceOp::avg);
      break;
    case ReduceOp::max:
      fold_rows<T, ReduceOp::max><<<blocks, kThreads, 0, stream>>>(in, row_stride, n, o, count, false);
      break;
    case ReduceOp::min:
      fold_rows<T, ReduceOp::min><<<blocks, kThreads, 0, stream>>>(in, row_stride, n, o, count, false);
      break;
    case ReduceOp::rounded_sum:
      fold_rows<T, ReduceOp::sum, true><<<blocks, kThreads, 0, stream>>>(in, row_stride, n, o, count, false);
      break;
  }
}

// data[i] = data[i] / divisor in the accumulation type, rounded once to T.
template <typename T>
__global__ void divide_kernel(T* data, int64_t count, int divisor) {
  using A = typename Accum<T>::type;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += step) {
    data[i] = Accum<T>::store(Accum<T>::load(data[i]) / static_cast<A>(divisor));
  }
}

template <typename T>
void launch_divide(void* data, int64_t count, int divisor, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((count + kThreads - 1) / kThreads, int64_t{1} << 16));
  divide_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(data), count, divisor);
}

}  // namespace

void divide_elements(void* data, int64_t count, DType dtype, int divisor, CUstream_st* stream) {
  if (count == 0) return;
  switch (dtype) {
    case DType::f32:
      launch_divide<float>(data, count, divisor, stream);
      break;
    case DType::f64:
      launch_divide<double>(data, count, divisor, stream);
      break;
    case DType::bf16:
      launch_divide<Bf16>(data, count, divisor, stream);
      break;
    case DType::f16:
      launch_divide<F16>(data, count, divisor, stream);
      break;
    default:
      LOCKSTEP_FAIL() << "divide_elements: " << dtype_name(dtype) << " is not a floating dtype";
  }
  const cudaError_t launched = cudaGetLastError();
  LOCKSTEP_CHECK(launched == cudaSuccess) << "divide_elements: launching the division of " << count << " "
                                          << dtype_name(dtype) << " failed: " << cudaGetErrorString(launched);
}

void tree_reduce_rows(const void* rows, int64_t row_stride, int n, void* out, int64_t count, DType dtype, ReduceOp op,
                      CUstream_st* stream) {
  LOCKSTEP_CHECK(n >= 1) << "tree_reduce_rows needs at least one row, got " << n;
  LOCKSTEP_CHECK(row_stride >= count) << "tree_reduce_rows: rows of " << count << " elements cannot be " << row_stride
                                      << " elements apart";
  check_reducible(dtype, op);
  if (count == 0) return;
  switch (dtype) {
    case DType::f32:
      launch<float>(rows, row_stride, n, out, count, op, stream);
      break;
    case DType::f64:
      launch<double>(rows, row_stride, n, out, count, op, stream);
      break;
    case DType::bf16:
      launch<Bf16>(rows, row_stride, n, out, count, op, stream);
      break;
    case DType::f16:
      launch<F16>(rows, row_stride, n, out, count, op, stream);
      break;
    case DType::i32:
      launch<int32_t>(rows, row_stride, n, out, count, op, stream);
      break;
    case DType::i64:
      launch<int64_t>(rows, row_stride, n, out, count, op, stream);
      break;
    case DType::u8:
      LOCKSTEP_FAIL() << "tree_reduce_rows: u8 is not reducible";
  }
  const cudaError_t launched = cudaGetLastError();
  LOCKSTEP_CHECK(launched == cudaSuccess) << "tree_reduce_rows: launching the fold of " << n << " rows of " << count
                                          << " " << dtype_name(dtype) << " failed: " << cudaGetErrorString(launched);
}

}  // namespace lockstep::comm::cuda
