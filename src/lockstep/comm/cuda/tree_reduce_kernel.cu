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

// The fold of one element over n leaves, leaf(k) giving leaf k's value in the accumulation
// type. tree_reduce splits n leaves at the largest power of two p below n: a perfect tree
// over the first p, then the same rule on the rest. Reading the leaves left to right and
// merging the two top partials whenever they cover equal powers of two (a binary counter)
// builds exactly those perfect trees; what is left on the stack are the perfect trees of n's
// binary digits, largest first, which the split rule joins from the right:
// x[0..p) + (x[p..p+q) + (...)). The CPU fold of three leaves is (x0+x1)+x2; so is this.
template <typename T, ReduceOp op, bool rounded, typename Leaf>
__device__ typename Accum<T>::type fold_leaves(int n, const Leaf& leaf) {
  using A = typename Accum<T>::type;
  A partial[kMaxDepth];
  int height[kMaxDepth];
  int top = 0;
  for (int k = 0; k < n; ++k) {
    A value = leaf(k);
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
  return result;
}

// The fold's result as stored: avg divides the sum afterwards, in the accumulation type.
template <typename T>
__device__ T finish(typename Accum<T>::type result, int n, bool average) {
  using A = typename Accum<T>::type;
  if constexpr (!std::is_integral_v<A>) {
    if (average) result = result / static_cast<A>(n);
  }
  return Accum<T>::store(result);
}

// Leaf k of element i: row k of rows laid out row_stride elements apart.
template <typename T>
struct RowLeaf {
  const T* rows;
  int64_t row_stride;
  int64_t i;
  __device__ typename Accum<T>::type operator()(int k) const { return Accum<T>::load(rows[k * row_stride + i]); }
};

// One thread per element.
template <typename T, ReduceOp op, bool rounded = false>
__global__ void fold_rows(const T* rows, int64_t row_stride, int n, T* out, int64_t count, bool average) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += step) {
    out[i] = finish<T>(fold_leaves<T, op, rounded>(n, RowLeaf<T>{rows, row_stride, i}), n, average);
  }
}

// The inputs of tree_reduce_inputs, passed by value in the kernel's parameters (at most
// 4 KiB of them), so a launch needs no table in device memory. The kernel takes it as a
// __grid_constant__, so indexing it reads the parameters in place instead of a copy of
// the whole table in each thread's local memory.
struct InputTable {
  const void* inputs[kMaxTreeReduceInputs];
};

// Leaf k of element i: element i of input k.
template <typename T>
struct InputLeaf {
  const void* const* inputs;
  int64_t i;
  __device__ typename Accum<T>::type operator()(int k) const {
    return Accum<T>::load(static_cast<const T*>(inputs[k])[i]);
  }
};

template <typename T, ReduceOp op, bool rounded = false>
__global__ void fold_inputs(const __grid_constant__ InputTable table, int n, T* out, int64_t count, bool average) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += step) {
    out[i] = finish<T>(fold_leaves<T, op, rounded>(n, InputLeaf<T>{table.inputs, i}), n, average);
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

template <typename T>
void launch_inputs(const InputTable& table, int n, void* out, int64_t count, ReduceOp op, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((count + kThreads - 1) / kThreads, int64_t{1} << 16));
  T* o = static_cast<T*>(out);
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      fold_inputs<T, ReduceOp::sum><<<blocks, kThreads, 0, stream>>>(table, n, o, count, op == ReduceOp::avg);
      break;
    case ReduceOp::max:
      fold_inputs<T, ReduceOp::max><<<blocks, kThreads, 0, stream>>>(table, n, o, count, false);
      break;
    case ReduceOp::min:
      fold_inputs<T, ReduceOp::min><<<blocks, kThreads, 0, stream>>>(table, n, o, count, false);
      break;
    case ReduceOp::rounded_sum:
      fold_inputs<T, ReduceOp::sum, true><<<blocks, kThreads, 0, stream>>>(table, n, o, count, false);
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

void tree_reduce_inputs(const void* const* inputs, int n, void* out, int64_t count, DType dtype, ReduceOp op,
                        CUstream_st* stream) {
  LOCKSTEP_CHECK(n >= 1 && n <= kMaxTreeReduceInputs)
      << "tree_reduce_inputs folds 1 to " << kMaxTreeReduceInputs << " inputs in one launch, got " << n;
  check_reducible(dtype, op);
  if (count == 0) return;
  InputTable table{};
  for (int k = 0; k < n; ++k) table.inputs[k] = inputs[k];
  switch (dtype) {
    case DType::f32:
      launch_inputs<float>(table, n, out, count, op, stream);
      break;
    case DType::f64:
      launch_inputs<double>(table, n, out, count, op, stream);
      break;
    case DType::bf16:
      launch_inputs<Bf16>(table, n, out, count, op, stream);
      break;
    case DType::f16:
      launch_inputs<F16>(table, n, out, count, op, stream);
      break;
    case DType::i32:
      launch_inputs<int32_t>(table, n, out, count, op, stream);
      break;
    case DType::i64:
      launch_inputs<int64_t>(table, n, out, count, op, stream);
      break;
    case DType::u8:
      LOCKSTEP_FAIL() << "tree_reduce_inputs: u8 is not reducible";
  }
  const cudaError_t launched = cudaGetLastError();
  LOCKSTEP_CHECK(launched == cudaSuccess) << "tree_reduce_inputs: launching the fold of " << n << " inputs of " << count
                                          << " " << dtype_name(dtype) << " failed: " << cudaGetErrorString(launched);
}

}  // namespace lockstep::comm::cuda
