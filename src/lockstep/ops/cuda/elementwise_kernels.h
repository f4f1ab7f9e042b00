// GPU kernels for elementwise arithmetic with NumPy broadcasting and for the pointwise
// activations and their derivatives: ops/cpu/elementwise's functions on device pointers.
// Every output element depends only on its own inputs, so results never depend on the launch.
// Callable from plain C++ (no CUDA headers needed).
#pragma once

#include <cstdint>

struct CUstream_st;  // = cudaStream_t

namespace lockstep::ops::cuda {

// Mirrors cpu::BinaryOp and cpu::UnaryOp (ops/cpu/elementwise.h, which this C++17 code cannot
// include); ops/elementwise.cpp maps one onto the other.
enum class BinaryOp { add, sub, mul, div };
enum class UnaryOp { relu, gelu, tanh, exp, log, sqrt, square };

// Operand shapes as the kernels take them: `rank` sizes, row-major, contiguous data.
struct ShapeRef {
  const int64_t* sizes = nullptr;
  int rank = 0;
};

// out[out_shape] = a op b, where a_shape and b_shape broadcast to out_shape.
template <typename T>
void binary(BinaryOp op, const T* a, ShapeRef a_shape, const T* b, ShapeRef b_shape, T* out, ShapeRef out_shape,
            CUstream_st* stream);

// out[out_shape] = x broadcast from x_shape, times scale (the gradient of a sum or mean).
template <typename T>
void broadcast_to(const T* x, ShapeRef x_shape, T* out, ShapeRef out_shape, T scale, CUstream_st* stream);

// out = alpha * x + beta over n elements, with cpu::affine's special cases (x + beta when
// alpha is 1, alpha * x when beta is 0).
template <typename T>
void affine(const T* x, T alpha, T beta, T* out, int64_t n, CUstream_st* stream);

// out = f(x) over n elements.
template <typename T>
void unary(UnaryOp op, const T* x, T* out, int64_t n, CUstream_st* stream);

// grad_x = grad · f'(x), from `saved` = y or x as cpu::backward_uses_output(op) says.
template <typename T>
void unary_backward(UnaryOp op, const T* grad, const T* saved, T* grad_x, int64_t n, CUstream_st* stream);

}  // namespace lockstep::ops::cuda
