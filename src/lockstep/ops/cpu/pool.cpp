#include "lockstep/ops/cpu/pool.h"

#include <algorithm>

#include "lockstep/core/parallel.h"

namespace lockstep::cpu {
namespace {

int64_t plane_grain(const Window2d& win) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, win.in_plane())); }

// PyTorch's rule: a larger value, or a NaN, takes the window.
template <typename T>
bool beats(T candidate, T best) {
  return candidate > best || candidate != candidate;
}

// The common 2x2 window with stride 2 and no padding, without per-window bounds.
template <typename T>
void max_pool_2x2(const T* x, const Window2d& win, T* y, int32_t* argmax) {
  const int64_t W = win.in_w;
  for (int64_t oh = 0; oh < win.out_h; ++oh) {
    const T* r0 = x + 2 * oh * W;
    const T* r1 = r0 + W;
    T* out = y + oh * win.out_w;
    int32_t* arg = argmax + oh * win.out_w;
    const int32_t row_index = static_cast<int32_t>(2 * oh * W);
    for (int64_t ow = 0; ow < win.out_w; ++ow) {
      const int64_t w0 = 2 * ow;
      T best = r0[w0];
      int32_t index = static_cast<int32_t>(w0);
      if (beats(r0[w0 + 1], best)) best = r0[w0 + 1], index = static_cast<int32_t>(w0 + 1);
      if (beats(r1[w0], best)) best = r1[w0], index = static_cast<int32_t>(w0 + W);
      if (beats(r1[w0 + 1], best)) best = r1[w0 + 1], index = static_cast<int32_t>(w0 + W + 1);
      out[ow] = best;
      arg[ow] = row_index + index;
    }
  }
}

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
