#include "lockstep/ops/cpu/reduce.h"

#include <cstring>
#include <limits>

namespace lockstep::cpu {
namespace {

constexpr int kLanes = 32;

// The fixed-order lane sum behind sum_contiguous and sum_lanes_f64, accumulated in Acc
// (independent partial sums vectorize; a single running sum cannot, since float addition
// does not reassociate).
template <typename Acc, typename T>
Acc sum_lanes(const T* x, int64_t n) {
  Acc acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += static_cast<Acc>(x[i + j]);
  for (int j = 0; i + j < n; ++j) acc[j] += static_cast<Acc>(x[i + j]);
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  return acc[0];
}

// Keeps `a` unless b is larger or b is the first nan.
template <typename T>
bool takes_over(T b, T a) {
  return b > a || (b != b && a == a);
}

// dst[j] = sum over r < rows of src[r * stride + j], r in order.
template <typename T>
void sum_rows(const T* src, int64_t rows, int64_t width, int64_t stride, T* dst) {
  std::memcpy(dst, src, static_cast<size_t>(width) * sizeof(T));
  for (int64_t r = 1; r < rows; ++r) {
    const T* row = src + r * stride;
    for (int64_t j = 0; j < width; ++j) dst[j] += row[j];
  }
}

}  // namespace

template <typename T>
T sum_contiguous(const T* x, int64_t n) {
  if (n <= kGrain) return sum_lanes<T>(x, n);
  const int64_t chunks = (n + kGrain - 1) / kGrain;
  std::vector<T> partial(static_cast<size_t>(chunks));
  parallel_for(chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      partial[static_cast<size_t>(c)] = sum_lanes<T>(x + c * kGrain, std::min(kGrain, n - c * kGrain));
  });
  return sum_lanes<T>(partial.data(), chunks);
}

template <typename T>
double sum_lanes_f64(const T* x, int64_t n) {
  return sum_lanes<double>(x, n);
}

template <typename T>
T max_contiguous(const T* x, int64_t n) {
  T acc[kLanes];
  for (T& a : acc) a = -std::numeric_limits<T>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = takes_over(x[i + j], acc[j]) ? x[i + j] : acc[j];
  for (int j = 0; i + j < n; ++j) acc[j] = takes_over(x[i + j], acc[j]) ? x[i + j] : acc[j];
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int j = 0; j < width; ++j) acc[j] = takes_over(acc[j + width], acc[j]) ? acc[j + width] : acc[j];
  return acc[0];
}

template <typename T>
void sum_middle(const T* x, int64_t outer, int64_t n, int64_t inner, T* out) {
  if (outer <= 0 || inner <= 0) return;
  if (n == 0) {
    std::fill_n(out, outer * inner, T(0));
    return;
  }
  if (inner == 1) {
    for_each_tile(outer, 1, n, [&](int64_t o, int64_t, int64_t) { out[o] = sum_contiguous(x + o * n, n); });
    return;
  }
  // Few outputs over a long axis (a bias gradient over a large batch): fixed blocks of rows
  // give the parallelism, then the block sums are added in order.
  const int64_t block_rows = std::max<int64_t>(1, kGrain / inner);
  const int64_t blocks = (n + block_rows - 1) / block_rows;
  if (blocks > 1 && outer * inner < kGrain) {
    std::vector<T> partial(static_cast<size_t>(outer * blocks * inner));
    parallel_for(outer * blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t o = task / blocks, b = task % blocks;
        const int64_t r0 = b * block_rows, rows = std::min(block_rows, n - r0);
        sum_rows(x + (o * n + r0) * inner, rows, inner, inner, partial.data() + task * inner);
      }
    });
    for_each_tile(outer, inner, blocks, [&](int64_t o, int64_t c0, int64_t c1) {
      sum_rows(partial.data() + o * blocks * inner + c0, blocks, c1 - c0, inner, out + o * inner + c0);
    });
    return;
  }
  for_each_tile(outer, inner, n, [&](int64_t o, int64_t c0, int64_t c1) {
    sum_rows(x + o * n * inner + c0, n, c1 - c0, inner, out + o * inner + c0);
  });
}

std::vector<SumPass> plan_sum_axes(const Shape& shape, const std::vector<bool>& reduce) {
  std::vector<int64_t> sizes;
  std::vector<bool> reduced;
  for (size_t a = 0; a < shape.size(); ++a) {
    if (shape[a] == 1) continue;
    if (!sizes.empty() && reduced.back() == reduce[a]) {
      sizes.back() *= shape[a];
    } else {
      sizes.push_back(shape[a]);
      reduced.push_back(reduce[a]);
    }
  }
  std::vector<SumPass> passes;
  for (int64_t groups = std::count(reduced.begin(), reduced.end(), true); groups > 0; --groups) {
    size_t g = reduced.size();
    while (!reduced[--g]) {
    }
    int64_t outer = 1, inner = 1;
    for (size_t i = 0; i < g; ++i) outer *= sizes[i];
    for (size_t i = g + 1; i < sizes.size(); ++i) inner *= sizes[i];
    passes.push_back({outer, sizes[g], inner});
    sizes.erase(sizes.begin() + static_cast<std::ptrdiff_t>(g));
    reduced.erase(reduced.begin() + static_cast<std::ptrdiff_t>(g));
    if (g > 0 && g < sizes.size()) {  // the kept neighbours now touch
      sizes[g - 1] *= sizes[g];
      sizes.erase(sizes.begin() + static_cast<std::ptrdiff_t>(g));
      reduced.erase(reduced.begin() + static_cast<std::ptrdiff_t>(g));
    }
  }
  return passes;
}

template <typename T>
void sum_axes(const T* x, const Shape& shape, const std::vector<bool>& reduce, T* out) {
  const std::vector<SumPass> passes = plan_sum_axes(shape, reduce);
  if (passes.empty()) {
    std::copy_n(x, numel(shape), out);
    return;
  }
  // Every pass but the last writes a scratch buffer.
  std::vector<T> buffers[2];
  const T* src = x;
  for (size_t p = 0; p < passes.size(); ++p) {
    const SumPass& pass = passes[p];
    T* dst = out;
    if (p + 1 < passes.size()) {
      buffers[p % 2].resize(static_cast<size_t>(pass.outer * pass.inner));
      dst = buffers[p % 2].data();
    }
    sum_middle(src, pass.outer, pass.n, pass.inner, dst);
    src = dst;
  }
}

template <typename T>
void max_middle(const T* x, int64_t outer, int64_t n, int64_t inner, T* values, int64_t* indices) {
  if (inner == 1) {
    // The vectorized max first, then the first position holding it (or the first nan).
    for_each_tile(outer, 1, n, [&](int64_t o, int64_t, int64_t) {
      const T* row = x + o * n;
      const T best = max_contiguous(row, n);
      int64_t index = 0;
      if (best == best) {
        while (row[index] != best) ++index;
      } else {
        while (row[index] == row[index]) ++index;
      }
      if (values != nullptr) values[o] = best;
      indices[o] = index;
    });
    return;
  }
  for_each_tile(outer, inner, n, [&](int64_t o, int64_t c0, int64_t c1) {
    const int64_t width = c1 - c0;
    const T* src = x + o * n * inner + c0;
    std::vector<T> best(src, src + width);
    int64_t* index = indices + o * inner + c0;
    std::fill_n(index, width, int64_t{0});
    for (int64_t r = 1; r < n; ++r) {
      const T* row = src + r * inner;
      for (int64_t j = 0; j < width; ++j) {
        const bool take = takes_over(row[j], best[static_cast<size_t>(j)]);
        best[static_cast<size_t>(j)] = take ? row[j] : best[static_cast<size_t>(j)];
        index[j] = take ? r : index[j];
      }
    }
    if (values != nullptr) std::copy(best.begin(), best.end(), values + o * inner + c0);
  });
}

#define LOCKSTEP_INSTANTIATE(T)                                                    \
  template T sum_contiguous<T>(const T*, int64_t);                                 \
  template double sum_lanes_f64<T>(const T*, int64_t);                             \
  template T max_contiguous<T>(const T*, int64_t);                                 \
  template void sum_middle<T>(const T*, int64_t, int64_t, int64_t, T*);            \
  template void sum_axes<T>(const T*, const Shape&, const std::vector<bool>&, T*); \
  template void max_middle<T>(const T*, int64_t, int64_t, int64_t, T*, int64_t*);
LOCKSTEP_INSTANTIATE(float)
LOCKSTEP_INSTANTIATE(double)
#undef LOCKSTEP_INSTANTIATE

}  // namespace lockstep::cpu
