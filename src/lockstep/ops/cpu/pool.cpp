#include "lockstep/ops/cpu/pool.h"

#include <algorithm>

#include "lockstep/core/parallel.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace lockstep::cpu {
namespace {

int64_t plane_grain(const Window2d& win) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, win.in_plane())); }

// PyTorch's rule: a larger value, or a NaN, takes the window. Both compares are always
// made (| rather than ||), so callers can select on the result without a branch.
template <typename T>
bool beats(T candidate, T best) {
  return (candidate > best) | (candidate != candidate);
}

// The common 2x2 window with stride 2 and no padding, without per-window bounds, and
// without branches: which of four values wins is a coin toss on real activations, and
// mispredicted branches made this loop 15% of a CNN step.
template <typename T>
void max_pool_2x2(const T* x, const Window2d& win, T* y, int32_t* argmax) {
  const int64_t W = win.in_w;
  const auto below = static_cast<int32_t>(W);
  for (int64_t oh = 0; oh < win.out_h; ++oh) {
    const T* r0 = x + 2 * oh * W;
    const T* r1 = r0 + W;
    T* out = y + oh * win.out_w;
    int32_t* arg = argmax + oh * win.out_w;
    const auto row_index = static_cast<int32_t>(2 * oh * W);
    for (int64_t ow = 0; ow < win.out_w; ++ow) {
      const int64_t w0 = 2 * ow;
      const T v[4] = {r0[w0], r0[w0 + 1], r1[w0], r1[w0 + 1]};
      const int32_t at[4] = {0, 1, below, below + 1};
      T best = v[0];
      int32_t index = 0;
      for (int i = 1; i < 4; ++i) {
        const bool wins = beats(v[i], best);
        best = wins ? v[i] : best;
        index = wins ? at[i] : index;
      }
      out[ow] = best;
      arg[ow] = row_index + static_cast<int32_t>(w0) + index;
    }
  }
}

#if defined(__AVX512F__)
// The same for float, sixteen windows of a row at a time (the CNN's rows are 13 and 5
// windows long, too short for the compiler's vector loop to start).
template <>
void max_pool_2x2<float>(const float* x, const Window2d& win, float* y, int32_t* argmax) {
  const int64_t W = win.in_w;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i below = _mm512_set1_epi32(static_cast<int32_t>(W));
  const __m512i below_right = _mm512_set1_epi32(static_cast<int32_t>(W + 1));
  const __m512i one = _mm512_set1_epi32(1);
  const auto lanes = [](int64_t count) {
    return static_cast<__mmask16>((1u << static_cast<unsigned>(std::clamp<int64_t>(count, 0, 16))) - 1u);
  };
  // The left and right values of `n` windows starting at p.
  const auto split = [&](const float* p, int64_t n, __m512& left, __m512& right) {
    const __m512 lo = _mm512_maskz_loadu_ps(lanes(2 * n), p);
    const __m512 hi = _mm512_maskz_loadu_ps(lanes(2 * n - 16), p + 16);
    left = _mm512_permutex2var_ps(lo, even, hi);
    right = _mm512_permutex2var_ps(lo, odd, hi);
  };
  // PyTorch's rule, as beats(): a larger value, or a NaN, takes the window.
  const auto take = [](__m512 candidate, __m512i at, __m512& best, __m512i& index) {
    const __mmask16 wins =
        _mm512_cmp_ps_mask(candidate, best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(candidate, candidate, _CMP_UNORD_Q);
    best = _mm512_mask_mov_ps(best, wins, candidate);
    index = _mm512_mask_mov_epi32(index, wins, at);
  };
  for (int64_t oh = 0; oh < win.out_h; ++oh) {
    const float* r0 = x + 2 * oh * W;
    const float* r1 = r0 + W;
    for (int64_t ow = 0; ow < win.out_w; ow += 16) {
      const int64_t n = std::min<int64_t>(16, win.out_w - ow);
      __m512 v0, v1, v2, v3;
      split(r0 + 2 * ow, n, v0, v1);
      split(r1 + 2 * ow, n, v2, v3);
      __m512 best = v0;
      __m512i index = _mm512_setzero_si512();
      take(v1, one, best, index);
      take(v2, below, best, index);
      take(v3, below_right, best, index);
      // Window j's top-left input is 2·oh·W + 2·(ow + j).
      index =
          _mm512_add_epi32(index, _mm512_add_epi32(even, _mm512_set1_epi32(static_cast<int32_t>(2 * oh * W + 2 * ow))));
      _mm512_mask_storeu_ps(y + oh * win.out_w + ow, lanes(n), best);
      _mm512_mask_storeu_epi32(argmax + oh * win.out_w + ow, lanes(n), index);
    }
  }
}
#endif

template <typename T>
void max_pool_any(const T* x, const Window2d& win, T* y, int32_t* argmax) {
  for (int64_t oh = 0; oh < win.out_h; ++oh) {
    const auto [hs, he] = win.rows_under(oh);
    for (int64_t ow = 0; ow < win.out_w; ++ow) {
      const auto [ws, we] = win.cols_under(ow);
      int64_t index = hs * win.in_w + ws;
      T best = x[index];
      for (int64_t h = hs; h < he; ++h) {
        for (int64_t w = ws; w < we; ++w) {
          const T v = x[h * win.in_w + w];
          if (beats(v, best)) best = v, index = h * win.in_w + w;
        }
      }
      y[oh * win.out_w + ow] = best;
      argmax[oh * win.out_w + ow] = static_cast<int32_t>(index);
    }
  }
}

}  // namespace

template <typename T>
void max_pool2d_forward(const T* x, int64_t planes, const Window2d& win, T* y, int32_t* argmax) {
  const bool two_by_two = win.kernel_h == 2 && win.kernel_w == 2 && win.stride_h == 2 && win.stride_w == 2 &&
                          win.pad_h == 0 && win.pad_w == 0;
  parallel_for(planes, plane_grain(win), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* src = x + p * win.in_plane();
      T* dst = y + p * win.out_plane();
      int32_t* arg = argmax + p * win.out_plane();
      if (two_by_two) {
        max_pool_2x2(src, win, dst, arg);
      } else {
        max_pool_any(src, win, dst, arg);
      }
    }
  });
}

template <typename T>
void max_pool2d_backward(const T* dy, const int32_t* argmax, int64_t planes, const Window2d& win, T* dx) {
  parallel_for(planes, plane_grain(win), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      T* dst = dx + p * win.in_plane();
      const T* src = dy + p * win.out_plane();
      const int32_t* arg = argmax + p * win.out_plane();
      std::fill(dst, dst + win.in_plane(), T(0));
      for (int64_t i = 0; i < win.out_plane(); ++i) dst[arg[i]] += src[i];
    }
  });
}

template <typename T>
void avg_pool2d_forward(const T* x, int64_t planes, const Window2d& win, T* y) {
  const T scale = T(1) / static_cast<T>(win.kernel_area());
  parallel_for(planes, plane_grain(win), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* src = x + p * win.in_plane();
      T* dst = y + p * win.out_plane();
      for (int64_t oh = 0; oh < win.out_h; ++oh) {
        const auto [hs, he] = win.rows_under(oh);
        for (int64_t ow = 0; ow < win.out_w; ++ow) {
          const auto [ws, we] = win.cols_under(ow);
          T total = 0;
          for (int64_t h = hs; h < he; ++h)
            for (int64_t w = ws; w < we; ++w) total += src[h * win.in_w + w];
          dst[oh * win.out_w + ow] = total * scale;
        }
      }
    }
  });
}

template <typename T>
void avg_pool2d_backward(const T* dy, int64_t planes, const Window2d& win, T* dx) {
  const T scale = T(1) / static_cast<T>(win.kernel_area());
  parallel_for(planes, plane_grain(win), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      T* dst = dx + p * win.in_plane();
      const T* src = dy + p * win.out_plane();
      std::fill(dst, dst + win.in_plane(), T(0));
      for (int64_t oh = 0; oh < win.out_h; ++oh) {
        const auto [hs, he] = win.rows_under(oh);
        for (int64_t ow = 0; ow < win.out_w; ++ow) {
          const auto [ws, we] = win.cols_under(ow);
          const T share = src[oh * win.out_w + ow] * scale;
          for (int64_t h = hs; h < he; ++h)
            for (int64_t w = ws; w < we; ++w) dst[h * win.in_w + w] += share;
        }
      }
    }
  });
}

template void max_pool2d_forward<float>(const float*, int64_t, const Window2d&, float*, int32_t*);
template void max_pool2d_forward<double>(const double*, int64_t, const Window2d&, double*, int32_t*);
template void max_pool2d_backward<float>(const float*, const int32_t*, int64_t, const Window2d&, float*);
template void max_pool2d_backward<double>(const double*, const int32_t*, int64_t, const Window2d&, double*);
template void avg_pool2d_forward<float>(const float*, int64_t, const Window2d&, float*);
template void avg_pool2d_forward<double>(const double*, int64_t, const Window2d&, double*);
template void avg_pool2d_backward<float>(const float*, int64_t, const Window2d&, float*);
template void avg_pool2d_backward<double>(const double*, int64_t, const Window2d&, double*);

}  // namespace lockstep::cpu
