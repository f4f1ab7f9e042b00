#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "lockstep/comm/cuda/tree_reduce_kernel.h"
#include "lockstep/comm/tree_reduce.h"
#include "lockstep/core/error.h"

namespace lockstep::comm::cuda {
namespace {

// ---- bf16/f16 <-> f32: the bit manipulations of core/dtype.h and dtype.cpp, on the device.
// They must round (and keep NaN payloads) exactly as those do; the NcclCommunicator kernel
// test compares this kernel with tree_reduce bit for bit, specials included.

__device__ float bf16_bits_to_f32(uint16_t value) { return __uint_as_float(static_cast<uint32_t>(value) << 16); }

__device__ uint16_t f32_to_bf16_bits(float value) {
  uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

__device__ uint16_t f32_to_f16_bits(float value) {
  const uint32_t bits = __float_as_uint(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (abs < 0x38800000u) {
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t rounded = abs - 0x38000000u;
  rounded += 0xfffu + ((rounded >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

__device__ float f16_bits_to_f32(uint16_t value) {
  const uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
  const uint32_t exponent = (value >> 10) & 0x1fu;
  uint32_t mantissa = value & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400u) == 0);
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((mantissa & 0x3ffu) << 13);
  }
  return __uint_as_float(bits);
}

// ---- the arithmetic of tree_reduce.cpp: storage type -> accumulation type and back ----

struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

template <typename T>
struct Accum {
  using type = T;
  __device__ static T load(T v) { return v; }
  __device__ static T store(T v) { return v; }
};
template <>
struct Accum<Bf16> {
  using type = float;
  __device__ static float load(Bf16 v) { return bf16_bits_to_f32(v.bits); }
  __device__ static Bf16 store(float v) { return {f32_to_bf16_bits(v)}; }
};
template <>
struct Accum<F16> {
  using type = float;
  __device__ static float load(F16 v) { return f16_bits_to_f32(v.bits); }
  __device__ static F16 store(float v) { return {f32_to_f16_bits(v)}; }
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

// Deeper than any tree over an int count of leaves needs.
constexpr int kMaxDepth = 32;

// One thread per element. tree_reduce splits n leaves at the largest power of two p below
// n: a perfect tree over the first p, then the same rule on the rest. Reading the leaves
// left to right and merging the two top partials whenever they cover equal powers of two
// (a binary counter) builds exactly those perfect trees; what is left on the stack are the
// perfect trees of n's binary digits, largest first, which the split rule joins from the
// right: x[0..p) + (x[p..p+q) + (...)). The CPU fold of three leaves is (x0+x1)+x2; so is this.
template <typename T, ReduceOp op>
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
        value = combine<A, op>(partial[top - 1], value);
        --top;
        ++h;
      }
      partial[top] = value;
      height[top] = h;
      ++top;
    }
    A result = partial[top - 1];
    for (int j = top - 2; j >= 0; --j) result = combine<A, op>(partial[j], result);
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
  }
}

}  // namespace

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
