#include "lockstep/ops/cpu/elementwise.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/core/parallel.h"
#include "lockstep/ops/cpu/fast_math.h"
#include "lockstep/ops/cpu/reduce.h"

namespace lockstep::cpu {
namespace {

// Transcendental functions cost tens of flops per element: split them into smaller tasks.
constexpr int64_t kMathGrain = kGrain / 4;

// The broadcast as nested loops over merged axes, outermost first: the element strides of
// a and b along each axis (0 where that operand is broadcast). The last axis has strides
// 0 or 1, which is what the inner loops specialize on.
struct BroadcastLayout {
  std::vector<int64_t> sizes, a_strides, b_strides;
};

// Element strides of a contiguous operand of shape s, left-padded to rank, 0 on its size-1 axes.
Strides broadcast_strides(const Shape& s, size_t rank) {
  Strides strides(rank, 0);
  int64_t stride = 1;
  for (size_t i = s.size(); i-- > 0;) {
    strides[i + rank - s.size()] = s[i] == 1 ? 0 : stride;
    stride *= s[i];
  }
  return strides;
}

BroadcastLayout merge_axes(const Shape& a_shape, const Shape& b_shape, const Shape& out_shape) {
  const size_t rank = out_shape.size();
  const Strides sa = broadcast_strides(a_shape, rank), sb = broadcast_strides(b_shape, rank);
  BroadcastLayout layout;
  for (size_t i = 0; i < rank; ++i) {
    const int64_t size = out_shape[i];
    if (size == 1) continue;
    // An axis joins the one before it when, for both operands, stepping over it whole equals
    // one step of the outer axis (also true when both are broadcast along both).
    if (!layout.sizes.empty() && layout.a_strides.back() == sa[i] * size && layout.b_strides.back() == sb[i] * size) {
      layout.sizes.back() *= size;
      layout.a_strides.back() = sa[i];
      layout.b_strides.back() = sb[i];
    } else {
      layout.sizes.push_back(size);
      layout.a_strides.push_back(sa[i]);
      layout.b_strides.push_back(sb[i]);
    }
  }
  if (layout.sizes.empty()) layout = {{1}, {0}, {0}};
  return layout;
}

template <typename T, typename F>
inline void binary_row(const F& f, const T* a, int64_t sa, const T* b, int64_t sb, T* __restrict out, int64_t n) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
  } else if (sa == 1) {
    const T y = *b;
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], y);
  } else if (sb == 1) {
    const T x = *a;
    for (int64_t i = 0; i < n; ++i) out[i] = f(x, b[i]);
  } else {
    std::fill_n(out, n, f(*a, *b));
  }
}

// Walks the output in parallel chunks of flat indices; each chunk resumes the nested loops
// at its first element and runs whole (or partial) rows of the last axis.
template <typename T, typename F>
void run_broadcast(const F& f, const T* a, const Shape& a_shape, const T* b, const Shape& b_shape, T* out,
                   const Shape& out_shape) {
  const int64_t total = numel(out_shape);
  if (total == 0) return;
  const BroadcastLayout layout = merge_axes(a_shape, b_shape, out_shape);
  const size_t outer_rank = layout.sizes.size() - 1;
  const int64_t inner = layout.sizes.back();
  const int64_t sa = layout.a_strides.back(), sb = layout.b_strides.back();
  if (outer_rank == 0) {
    parallel_for(total, kGrain, [&](int64_t begin, int64_t end) {
      binary_row(f, a + begin * sa, sa, b + begin * sb, sb, out + begin, end - begin);
    });
    return;
  }
  parallel_for(total, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> index(outer_rank);
    int64_t row = begin / inner, col = begin % inner;
    for (size_t d = outer_rank; d-- > 0;) {
      index[d] = row % layout.sizes[d];
      row /= layout.sizes[d];
    }
    for (int64_t pos = begin; pos < end;) {
      int64_t oa = col * sa, ob = col * sb;
      for (size_t d = 0; d < outer_rank; ++d) {
        oa += index[d] * layout.a_strides[d];
        ob += index[d] * layout.b_strides[d];
      }
      const int64_t len = std::min(inner - col, end - pos);
      binary_row(f, a + oa, sa, b + ob, sb, out + pos, len);
      pos += len;
      col = 0;
      for (size_t d = outer_rank; d-- > 0;) {
        if (++index[d] < layout.sizes[d]) break;
        index[d] = 0;
      }
    }
  });
}

template <typename T, typename F>
void map(const T* x, T* __restrict out, int64_t n, int64_t grain, const F& f) {
  parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = f(x[i]);
  });
}

template <typename T, typename F>
void map2(const T* g, const T* s, T* __restrict out, int64_t n, int64_t grain, const F& f) {
  parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = f(g[i], s[i]);
  });
}

// 1 / sqrt(2 pi): the standard normal density at 0.
template <typename T>
constexpr T kInvSqrt2Pi = T(0.398942280401432677939946059934);

}  // namespace

template <typename T>
void binary(BinaryOp op, const T* a, const Shape& a_shape, const T* b, const Shape& b_shape, T* out,
            const Shape& out_shape) {
  switch (op) {
    case BinaryOp::add:
      return run_broadcast([](T x, T y) { return x + y; }, a, a_shape, b, b_shape, out, out_shape);
    case BinaryOp::sub:
      return run_broadcast([](T x, T y) { return x - y; }, a, a_shape, b, b_shape, out, out_shape);
    case BinaryOp::mul:
      return run_broadcast([](T x, T y) { return x * y; }, a, a_shape, b, b_shape, out, out_shape);
    case BinaryOp::div:
      return run_broadcast([](T x, T y) { return x / y; }, a, a_shape, b, b_shape, out, out_shape);
  }
}

template <typename T>
void broadcast_to(const T* x, const Shape& x_shape, T* out, const Shape& out_shape, T scale) {
  if (scale == T(1)) {
    run_broadcast([](T v, T) { return v; }, x, x_shape, x, x_shape, out, out_shape);
  } else {
    run_broadcast([scale](T v, T) { return v * scale; }, x, x_shape, x, x_shape, out, out_shape);
  }
}

// affine is in affine.cpp, which never fuses its multiply and add.

template <typename T>
void unary(UnaryOp op, const T* x, T* out, int64_t n) {
  switch (op) {
    case UnaryOp::relu:
      return map(x, out, n, kGrain, [](T v) { return v < T(0) ? T(0) : v; });  // nan stays nan
    case UnaryOp::gelu:
      return map(x, out, n, kMathGrain, [](T v) { return v * normal_cdf(v); });
    case UnaryOp::tanh:
      return map(x, out, n, kMathGrain, [](T v) { return tanh_fast(v); });
    case UnaryOp::exp:
      return map(x, out, n, kMathGrain, [](T v) { return exp_fast(v); });
    case UnaryOp::log:
      return map(x, out, n, kMathGrain, [](T v) { return std::log(v); });
    case UnaryOp::sqrt:
      return map(x, out, n, kMathGrain, [](T v) { return std::sqrt(v); });
    case UnaryOp::square:
      return map(x, out, n, kGrain, [](T v) { return v * v; });
  }
}

bool backward_uses_output(UnaryOp op) {
  return op == UnaryOp::relu || op == UnaryOp::tanh || op == UnaryOp::exp || op == UnaryOp::sqrt;
}

template <typename T>
void unary_backward(UnaryOp op, const T* grad, const T* saved, T* grad_x, int64_t n) {
  switch (op) {
    case UnaryOp::relu:  // saved y: y > 0 exactly where x > 0
      return map2(grad, saved, grad_x, n, kGrain, [](T g, T y) { return y > T(0) ? g : T(0); });
    case UnaryOp::gelu:  // d/dx x·Phi(x) = Phi(x) + x·phi(x)
      return map2(grad, saved, grad_x, n, kMathGrain,
                  [](T g, T x) { return g * (normal_cdf(x) + x * kInvSqrt2Pi<T> * gauss_fast(x)); });
    case UnaryOp::tanh:
      return map2(grad, saved, grad_x, n, kGrain, [](T g, T y) { return g * (T(1) - y * y); });
    case UnaryOp::exp:
      return map2(grad, saved, grad_x, n, kGrain, [](T g, T y) { return g * y; });
    case UnaryOp::log:
      return map2(grad, saved, grad_x, n, kGrain, [](T g, T x) { return g / x; });
    case UnaryOp::sqrt:
      return map2(grad, saved, grad_x, n, kGrain, [](T g, T y) { return g / (T(2) * y); });
    case UnaryOp::square:
      return map2(grad, saved, grad_x, n, kGrain, [](T g, T x) { return T(2) * x * g; });
  }
}

#define LOCKSTEP_INSTANTIATE(T)                                                                        \
  template void binary<T>(BinaryOp, const T*, const Shape&, const T*, const Shape&, T*, const Shape&); \
  template void broadcast_to<T>(const T*, const Shape&, T*, const Shape&, T);                          \
  template void unary<T>(UnaryOp, const T*, T*, int64_t);                                              \
  template void unary_backward<T>(UnaryOp, const T*, const T*, T*, int64_t);
LOCKSTEP_INSTANTIATE(float)
LOCKSTEP_INSTANTIATE(double)
#undef LOCKSTEP_INSTANTIATE

}  // namespace lockstep::cpu
