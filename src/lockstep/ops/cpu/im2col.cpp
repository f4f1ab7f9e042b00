#include "lockstep/ops/cpu/im2col.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "lockstep/core/parallel.h"

namespace lockstep::cpu {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// The output columns [lo, hi) whose input column ow·stride - pad + k lies inside [0, size).
struct ValidRange {
  int64_t lo, hi;
};

ValidRange valid_outputs(int64_t k, int64_t size, int64_t stride, int64_t pad, int64_t out) {
  const int64_t lo = std::clamp<int64_t>(ceil_div(pad - k, stride), 0, out);
  const int64_t last = size - 1 + pad - k;  // largest ow·stride allowed
  const int64_t hi = last < 0 ? lo : std::clamp<int64_t>(last / stride + 1, lo, out);
  return {lo, hi};
}

// Copies a row of n elements. The rows here are short (a convolution's output width, tens
// of elements), where a call to memmove costs more than the copy itself: 32-byte vector
// moves inline instead, the last one overlapping its neighbour. They move T-typed vectors,
// not bytes, so the compiler knows they cannot change the loop's indices.
template <typename T>
struct Block32;
template <>
struct Block32<float> {
  typedef float type __attribute__((vector_size(32), aligned(4)));
};
template <>
struct Block32<double> {
  typedef double type __attribute__((vector_size(32), aligned(8)));
};

template <typename T>
void copy_row(const T* src, T* dst, int64_t n) {
  using Block = typename Block32<T>::type;
  constexpr int64_t kBlock = 32 / sizeof(T);
  if (n < kBlock) {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
    return;
  }
  for (int64_t i = 0; i + kBlock < n; i += kBlock)
    *reinterpret_cast<Block*>(dst + i) = *reinterpret_cast<const Block*>(src + i);
  *reinterpret_cast<Block*>(dst + n - kBlock) = *reinterpret_cast<const Block*>(src + n - kBlock);
}

// One input plane's columns for a window of stride 1 without padding, the common case:
// each kernel offset's rows are slices of the input's rows, so this is only row copies.
// (The general loop below spends more on its bounds than on copying at these sizes.)
template <typename T>
void im2col_plane_unpadded(const T* src, const Window2d& win, T* dst, int64_t ld) {
  const int64_t W = win.in_w, OH = win.out_h, OW = win.out_w, KH = win.kernel_h, KW = win.kernel_w;
  for (int64_t kh = 0; kh < KH; ++kh) {
    for (int64_t kw = 0; kw < KW; ++kw) {
      const T* s = src + kh * W + kw;
      T* d = dst + (kh * KW + kw) * ld;
      for (int64_t oh = 0; oh < OH; ++oh) copy_row(s + oh * W, d + oh * OW, OW);
    }
  }
}

// A padded window of stride 1 (ResNet's 3x3 convolutions): the plane is first copied into a
// zero-bordered one, whose columns are then row copies as above. Cutting each row at the
// borders instead (the general loop below) spends more on bounds and short fills than on
// copying at these sizes. The columns are the same values either way.
template <typename T>
void im2col_plane_padded_stride1(const T* src, const Window2d& win, T* dst, int64_t ld, std::vector<T>& plane) {
  Window2d padded = win;
  padded.in_h = win.in_h + 2 * win.pad_h;
  padded.in_w = win.in_w + 2 * win.pad_w;
  padded.pad_h = padded.pad_w = 0;
  plane.assign(static_cast<size_t>(padded.in_h * padded.in_w), T(0));
  for (int64_t h = 0; h < win.in_h; ++h)
    std::memcpy(plane.data() + (h + win.pad_h) * padded.in_w + win.pad_w, src + h * win.in_w,
                static_cast<size_t>(win.in_w) * sizeof(T));
  im2col_plane_unpadded(plane.data(), padded, dst, ld);
}

// Enough elements per task that threading pays for itself.
int64_t task_grain(const Window2d& win) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, win.kernel_area() * win.out_plane()));
}

}  // namespace

template <typename T>
void im2col(const T* x, int64_t count, int64_t channels, const Window2d& win, T* col, int64_t ld) {
  const int64_t H = win.in_h, W = win.in_w, OH = win.out_h, OW = win.out_w, P = win.out_plane();
  const int64_t KH = win.kernel_h, KW = win.kernel_w, sh = win.stride_h, sw = win.stride_w;
  const int64_t ph = win.pad_h, pw = win.pad_w;
  const bool stride1 = sh == 1 && sw == 1, unpadded = stride1 && ph == 0 && pw == 0;
  parallel_for(count * channels, task_grain(win), [&](int64_t begin, int64_t end) {
    std::vector<T> plane;  // the padded plane, reused across this task range's planes
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / channels, c = task % channels;
      const T* src = x + task * H * W;
      if (unpadded) {
        im2col_plane_unpadded(src, win, col + c * KH * KW * ld + g * P, ld);
        continue;
      }
      if (stride1) {
        im2col_plane_padded_stride1(src, win, col + c * KH * KW * ld + g * P, ld, plane);
        continue;
      }
      for (int64_t kh = 0; kh < KH; ++kh) {
        for (int64_t kw = 0; kw < KW; ++kw) {
          T* dst = col + ((c * KH + kh) * KW + kw) * ld + g * P;
          const ValidRange cols = valid_outputs(kw, W, sw, pw, OW);
          for (int64_t oh = 0; oh < OH; ++oh) {
            T* d = dst + oh * OW;
            const int64_t ih = oh * sh - ph + kh;
            if (ih < 0 || ih >= H) {
              std::fill(d, d + OW, T(0));
              continue;
            }
            const int64_t base = ih * W - pw + kw;  // src[base + ow·sw] is the input for output ow
            // The fills are empty without padding: skipped rather than a call each.
            if (cols.lo > 0) std::fill(d, d + cols.lo, T(0));
            if (sw == 1) {
              copy_row(src + base + cols.lo, d + cols.lo, cols.hi - cols.lo);
            } else {
              for (int64_t ow = cols.lo; ow < cols.hi; ++ow) d[ow] = src[base + ow * sw];
            }
            if (cols.hi < OW) std::fill(d + cols.hi, d + OW, T(0));
          }
        }
      }
    }
  });
}

template <typename T>
void col2im(const T* col, int64_t ld, int64_t count, int64_t channels, const Window2d& win, T* x) {
  const int64_t H = win.in_h, W = win.in_w, OH = win.out_h, OW = win.out_w, P = win.out_plane();
  const int64_t KH = win.kernel_h, KW = win.kernel_w, sh = win.stride_h, sw = win.stride_w;
  const int64_t ph = win.pad_h, pw = win.pad_w;
  parallel_for(count * channels, task_grain(win), [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / channels, c = task % channels;
      T* dst = x + task * H * W;
      std::fill(dst, dst + H * W, T(0));
      for (int64_t kh = 0; kh < KH; ++kh) {
        for (int64_t kw = 0; kw < KW; ++kw) {
          const T* src = col + ((c * KH + kh) * KW + kw) * ld + g * P;
          const ValidRange cols = valid_outputs(kw, W, sw, pw, OW);
          for (int64_t oh = 0; oh < OH; ++oh) {
            const int64_t ih = oh * sh - ph + kh;
            if (ih < 0 || ih >= H) continue;
            const T* s = src + oh * OW;
            T* d = dst + ih * W;
            const int64_t base = kw - pw;  // d[base + ow·sw] receives output ow
            if (sw == 1) {
              for (int64_t ow = cols.lo; ow < cols.hi; ++ow) d[base + ow] += s[ow];
            } else {
              for (int64_t ow = cols.lo; ow < cols.hi; ++ow) d[base + ow * sw] += s[ow];
            }
          }
        }
      }
    }
  });
}

template void im2col<float>(const float*, int64_t, int64_t, const Window2d&, float*, int64_t);
template void im2col<double>(const double*, int64_t, int64_t, const Window2d&, double*, int64_t);
template void col2im<float>(const float*, int64_t, int64_t, int64_t, const Window2d&, float*);
template void col2im<double>(const double*, int64_t, int64_t, int64_t, const Window2d&, double*);

}  // namespace lockstep::cpu
