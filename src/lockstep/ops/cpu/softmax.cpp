#include "lockstep/ops/cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lockstep/core/parallel.h"
#include "lockstep/ops/cpu/fast_math.h"
#include "lockstep/ops/cpu/reduce.h"

namespace lockstep::cpu {
namespace {

// Runs body(begin, end) over rows of `width` elements in parallel tasks of about kGrain elements.
template <typename Body>
void for_rows(int64_t rows, int64_t width, const Body& body) {
  parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(width, 1)), body);
}

// One row along a contiguous axis (inner == 1).
template <typename T>
void softmax_row(const T* x, T* __restrict y, int64_t n, bool log) {
  const T m = max_contiguous(x, n);
  for (int64_t j = 0; j < n; ++j) y[j] = exp_fast(x[j] - m);
  const T s = sum_contiguous(y, n);
  if (log) {
    const T log_s = std::log(s);
    for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - m) - log_s;
  } else {
    const T inv = T(1) / s;
    for (int64_t j = 0; j < n; ++j) y[j] *= inv;
  }
}

// Columns [0, width) of one [n, inner] block along a strided axis: the row loop is outside,
// so the column loops vectorize.
template <typename T>
void softmax_columns(const T* x, T* y, int64_t n, int64_t inner, int64_t width, bool log) {
  std::vector<T> m(x, x + width), s(static_cast<size_t>(width), T(0));
  for (int64_t r = 1; r < n; ++r)
    for (int64_t j = 0; j < width; ++j) m[j] = x[r * inner + j] > m[j] ? x[r * inner + j] : m[j];
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < width; ++j) {
      y[r * inner + j] = exp_fast(x[r * inner + j] - m[j]);
      s[j] += y[r * inner + j];
    }
  }
  for (int64_t j = 0; j < width; ++j) s[j] = log ? std::log(s[j]) : T(1) / s[j];
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < width; ++j) {
      T& out = y[r * inner + j];
      out = log ? (x[r * inner + j] - m[j]) - s[j] : out * s[j];
    }
  }
}

}  // namespace

template <typename T>
void softmax(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log) {
  if (n == 0) return;
  if (inner == 1) {
    for_rows(outer, n, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) softmax_row(x + o * n, y + o * n, n, log);
    });
    return;
  }
  for_each_tile(outer, inner, n, [&](int64_t o, int64_t c0, int64_t c1) {
    const int64_t base = o * n * inner + c0;
    softmax_columns(x + base, y + base, n, inner, c1 - c0, log);
  });
}

template <typename T>
void softmax_backward(const T* grad, const T* y, T* grad_x, int64_t outer, int64_t n, int64_t inner, bool log) {
  if (n == 0) return;
  if (inner == 1) {
    for_rows(outer, n, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        const T* g = grad + o * n;
        const T* yr = y + o * n;
        T* __restrict gx = grad_x + o * n;
        if (log) {
          const T s = sum_contiguous(g, n);
          for (int64_t j = 0; j < n; ++j) gx[j] = g[j] - exp_fast(yr[j]) * s;
        } else {
          for (int64_t j = 0; j < n; ++j) gx[j] = g[j] * yr[j];  // scratch for the dot product
          const T dot = sum_contiguous(gx, n);
          for (int64_t j = 0; j < n; ++j) gx[j] = yr[j] * (g[j] - dot);
        }
      }
    });
    return;
  }
  for_each_tile(outer, inner, n, [&](int64_t o, int64_t c0, int64_t c1) {
    const int64_t base = o * n * inner + c0, width = c1 - c0;
    const T* g = grad + base;
    const T* yb = y + base;
    T* gx = grad_x + base;
    std::vector<T> s(static_cast<size_t>(width), T(0));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < width; ++j) s[j] += log ? g[r * inner + j] : g[r * inner + j] * yb[r * inner + j];
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < width; ++j) {
        const int64_t k = r * inner + j;
        gx[k] = log ? g[k] - exp_fast(yb[k]) * s[j] : yb[k] * (g[k] - s[j]);
      }
    }
  });
}

template <typename T, typename Label>
void cross_entropy(const T* logits, const Label* labels, int64_t rows, int64_t classes, T* losses, T* lse) {
  for_rows(rows, classes, [&](int64_t begin, int64_t end) {
    std::vector<T> e(static_cast<size_t>(classes));
    for (int64_t i = begin; i < end; ++i) {
      const T* row = logits + i * classes;
      const T m = max_contiguous(row, classes);
      for (int64_t j = 0; j < classes; ++j) e[j] = exp_fast(row[j] - m);
      lse[i] = m + std::log(sum_contiguous(e.data(), classes));
      losses[i] = lse[i] - row[labels[i]];
    }
  });
}

template <typename T, typename Label>
void cross_entropy_backward(const T* logits, const Label* labels, const T* lse, const T* scale, int64_t scale_stride,
                            int64_t rows, int64_t classes, T* grad) {
  for_rows(rows, classes, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* row = logits + i * classes;
      T* __restrict g = grad + i * classes;
      const T s = scale[i * scale_stride], l = lse[i];
      for (int64_t j = 0; j < classes; ++j) g[j] = exp_fast(row[j] - l) * s;
      g[labels[i]] -= s;
    }
  });
}

#define LOCKSTEP_INSTANTIATE(T)                                                                                    \
  template void softmax<T>(const T*, T*, int64_t, int64_t, int64_t, bool);                                         \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, bool);                      \
  template void cross_entropy<T, int32_t>(const T*, const int32_t*, int64_t, int64_t, T*, T*);                     \
  template void cross_entropy<T, int64_t>(const T*, const int64_t*, int64_t, int64_t, T*, T*);                     \
  template void cross_entropy_backward<T, int32_t>(const T*, const int32_t*, const T*, const T*, int64_t, int64_t, \
                                                   int64_t, T*);                                                   \
  template void cross_entropy_backward<T, int64_t>(const T*, const int64_t*, const T*, const T*, int64_t, int64_t, \
                                                   int64_t, T*);
LOCKSTEP_INSTANTIATE(float)
LOCKSTEP_INSTANTIATE(double)
#undef LOCKSTEP_INSTANTIATE

}  // namespace lockstep::cpu
