// CPU kernels for elementwise arithmetic with NumPy broadcasting and for the pointwise
// activations and their derivatives. Inputs and outputs are contiguous; every output element
// depends only on its own inputs, so threads never change a result.
#pragma once

#include <cstdint>

#include "lockstep/core/shape.h"

namespace lockstep::cpu {

enum class BinaryOp { add, sub, mul, div };
enum class UnaryOp { relu, gelu, tanh, exp, log, sqrt, square };

// out[out_shape] = a op b, where a_shape and b_shape broadcast to out_shape. Axes are merged
// first, so same-shape, scalar, row ([rows, cols] op [cols]) and column ([rows, cols] op
// [rows, 1]) operands all run as plain vectorized loops.
template <typename T>
void binary(BinaryOp op, const T* a, const Shape& a_shape, const T* b, const Shape& b_shape, T* out,
            const Shape& out_shape);

// out[out_shape] = x broadcast from x_shape (the gradient of a sum), times scale.
template <typename T>
void broadcast_to(const T* x, const Shape& x_shape, T* out, const Shape& out_shape, T scale = T(1));

// out = alpha * x + beta over n elements (scalar add, scalar multiply, negation).
template <typename T>
void affine(const T* x, T alpha, T beta, T* out, int64_t n);

// out = f(x) over n elements.
template <typename T>
void unary(UnaryOp op, const T* x, T* out, int64_t n);

// True when unary_backward for op wants the forward output y; else it wants the input x.
bool backward_uses_output(UnaryOp op);

// grad_x = grad · f'(x), from `saved` = y or x as backward_uses_output(op) says. relu'(0) = 0.
template <typename T>
void unary_backward(UnaryOp op, const T* grad, const T* saved, T* grad_x, int64_t n);

}  // namespace lockstep::cpu
