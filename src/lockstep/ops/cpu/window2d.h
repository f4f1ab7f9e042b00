// The geometry of a 2-D sliding window over an H x W plane (kernel, stride, zero padding),
// shared by convolution (im2col) and pooling. make_window2d checks it and names what is wrong.
#pragma once

#include <cstdint>

#include "lockstep/core/error.h"

namespace lockstep::cpu {

struct Window2d {
  int64_t in_h = 0, in_w = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t out_h = 0, out_w = 0;

  int64_t in_plane() const { return in_h * in_w; }
  int64_t out_plane() const { return out_h * out_w; }
  int64_t kernel_area() const { return kernel_h * kernel_w; }

  // The input rows [begin, end) under output row oh, and the input columns under output
  // column ow: the window clipped to the unpadded plane.
  struct Span {
    int64_t begin, end;
  };
  Span rows_under(int64_t oh) const { return clip(oh * stride_h - pad_h, kernel_h, in_h); }
  Span cols_under(int64_t ow) const { return clip(ow * stride_w - pad_w, kernel_w, in_w); }

 private:
  static Span clip(int64_t start, int64_t kernel, int64_t size) {
    return {start < 0 ? 0 : start, start + kernel < size ? start + kernel : size};
  }
};

// Output size floor((in + 2·pad - kernel) / stride) + 1 on each axis, as PyTorch (no ceil mode).
inline Window2d make_window2d(const char* op, int64_t in_h, int64_t in_w, int64_t kernel_h, int64_t kernel_w,
                              int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w) {
  LOCKSTEP_CHECK(kernel_h >= 1 && kernel_w >= 1)
      << op << ": kernel must be at least 1x1, got " << kernel_h << "x" << kernel_w;
  LOCKSTEP_CHECK(stride_h >= 1 && stride_w >= 1)
      << op << ": stride must be positive, got (" << stride_h << ", " << stride_w << ")";
  LOCKSTEP_CHECK(pad_h >= 0 && pad_w >= 0)
      << op << ": padding must be non-negative, got (" << pad_h << ", " << pad_w << ")";
  const int64_t padded_h = in_h + 2 * pad_h, padded_w = in_w + 2 * pad_w;
  LOCKSTEP_CHECK(kernel_h <= padded_h && kernel_w <= padded_w)
      << op << ": kernel " << kernel_h << "x" << kernel_w << " is larger than the padded input " << padded_h << "x"
      << padded_w << " (input " << in_h << "x" << in_w << ", padding (" << pad_h << ", " << pad_w
      << ")); use a smaller kernel or more padding";
  Window2d w;
  w.in_h = in_h;
  w.in_w = in_w;
  w.kernel_h = kernel_h;
  w.kernel_w = kernel_w;
  w.stride_h = stride_h;
  w.stride_w = stride_w;
  w.pad_h = pad_h;
  w.pad_w = pad_w;
  w.out_h = (padded_h - kernel_h) / stride_h + 1;
  w.out_w = (padded_w - kernel_w) / stride_w + 1;
  return w;
}

}  // namespace lockstep::cpu
