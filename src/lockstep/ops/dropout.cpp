// Dropout masks from Philox: element j of global sample s uses word j % 4 of the block at
// counter (s << 32) | (j / 4), so a sample's mask is a function of (seed, stream, s, j) only.
// The mask is kept (one byte per element) for backward rather than drawn again. GPUs draw
// the same words (ops/cuda/random_kernels), so a mask is the same on every device.
#include "lockstep/ops/dropout.h"

#include <cmath>

#include "lockstep/autograd/node.h"
#include "lockstep/core/parallel.h"
#include "lockstep/core/philox.h"
#include "lockstep/ops/dispatch.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/ops/cuda/random_kernels.h"
#endif

namespace lockstep {
namespace {

constexpr int kLayerBits = 21, kStepBits = 40;

constexpr int kLanes = 16;

// philox4x32 (core/philox.cpp) for the counters first .. first + kLanes - 1 (the low word
// must not wrap), written lane by lane so the compiler vectorizes it; one out-of-line call
// per counter costs several ns an element. out[4·i + w] is word w of counter first + i.
// Tests check it against philox4x32.
void philox_lanes(uint64_t seed, uint64_t stream, uint64_t first, uint32_t (&out)[4 * kLanes]) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  const uint32_t lo = static_cast<uint32_t>(first), hi = static_cast<uint32_t>(first >> 32);
  for (uint32_t i = 0; i < kLanes; ++i) {
    uint32_t c0 = lo + i, c1 = hi, c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma GCC unroll 10
    for (int round = 0; round < 10; ++round) {
      const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
      const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
      c0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
      c2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
      c1 = static_cast<uint32_t>(p1);
      c3 = static_cast<uint32_t>(p0);
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    out[4 * i] = c0;
    out[4 * i + 1] = c1;
    out[4 * i + 2] = c2;
    out[4 * i + 3] = c3;
  }
}

// An element is kept when uint_to_unit_float(word) >= p, compared in integers as
// (word >> 8) >= ceil(p · 2^24), which is the same test.
uint32_t keep_threshold(double p) { return static_cast<uint32_t>(std::ceil(p * 16777216.0)); }

// 1 where the element is kept. Each sample is drawn on its own, so the split across threads
// cannot change the result.
void draw_mask(const DropoutKey& key, double p, int64_t samples, int64_t per_sample, uint8_t* mask) {
  const uint32_t threshold = keep_threshold(p);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(per_sample, 1));
  parallel_for(samples, grain, [&](int64_t begin, int64_t end) {
    // Locals, not captures: the byte stores below may alias anything reached by reference,
    // which would keep the compiler from vectorizing.
    const uint64_t seed = key.seed, stream = key.stream;
    const uint32_t limit = threshold;
    const int64_t n = per_sample;
    uint32_t words[4 * kLanes];
    for (int64_t s = begin; s < end; ++s) {
      const uint64_t base = static_cast<uint64_t>(key.first_sample + s) << 32;
      uint8_t* m = mask + s * n;
      for (int64_t j0 = 0; j0 < n; j0 += 4 * kLanes) {
        philox_lanes(seed, stream, base | static_cast<uint64_t>(j0 / 4), words);
        const int64_t count = std::min<int64_t>(4 * kLanes, n - j0);
        for (int64_t t = 0; t < count; ++t) m[j0 + t] = (words[t] >> 8) >= limit ? 1 : 0;
      }
    }
  });
}

// out = in · mask · scale, elementwise.
Tensor apply_mask(const Tensor& in, const Tensor& mask, double scale) {
  const Tensor src = in.contiguous();
  Tensor out = Tensor::empty(in.shape(), in.dtype(), in.device());
  ops::dispatch_float("dropout", in.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
    if (in.device().is_cuda()) {
      const lockstep::cuda::OnDevice on(in.device());
      ops::cuda::dropout_apply<T>(src.data_ptr<T>(), mask.data_ptr<uint8_t>(), src.numel(), static_cast<T>(scale),
                                  out.data_ptr<T>(), on.stream());
      return;
    }
#endif
    const T* x = src.data<T>();
    const uint8_t* m = mask.data<uint8_t>();
    T* y = out.data<T>();
    const T factor = static_cast<T>(scale);
    parallel_for(src.numel(), 32768, [x, m, y, factor](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) y[i] = m[i] ? x[i] * factor : T(0);
    });
  });
  return out;
}

}  // namespace

uint64_t dropout_stream(uint64_t layer, uint64_t step) {
  LOCKSTEP_CHECK(layer < (uint64_t{1} << kLayerBits))
      << "dropout_stream: layer " << layer << " is too large (at most 2^" << kLayerBits << " - 1)";
  LOCKSTEP_CHECK(step < (uint64_t{1} << kStepBits))
      << "dropout_stream: step " << step << " is too large (at most 2^" << kStepBits << " - 1)";
  // The purpose tag in the top bits keeps every id at or above 2^61, far from the small
  // RngStream values; layer and step fill disjoint bits, so no two pairs share an id.
  return (static_cast<uint64_t>(RngStream::dropout) << (kLayerBits + kStepBits)) | (layer << kStepBits) | step;
}

Tensor dropout(const Tensor& x, double p, bool training, const DropoutKey& key) {
  LOCKSTEP_CHECK(p >= 0 && p < 1) << "dropout: p must be in [0, 1), got " << p;
  if (!training || p == 0) return x;
  ops::require_device("dropout", ops::common_device("dropout", {x}));
  ops::require_float("dropout", x);
  LOCKSTEP_CHECK(x.dim() >= 1) << "dropout: input needs a sample axis (axis 0), got a scalar";
  LOCKSTEP_CHECK(key.first_sample >= 0) << "dropout: first_sample must be non-negative, got " << key.first_sample;
  const int64_t samples = x.size(0);
  const int64_t per_sample = samples > 0 ? x.numel() / samples : 0;
  LOCKSTEP_CHECK(key.first_sample + samples <= (int64_t{1} << 32))
      << "dropout: global sample index " << key.first_sample + samples - 1 << " is past 2^32";
  LOCKSTEP_CHECK(per_sample / 4 < (int64_t{1} << 32))
      << "dropout: " << per_sample << " elements per sample is more than 2^34";
  const Tensor mask = Tensor::empty(x.shape(), DType::u8, x.device());
  const double scale = 1.0 / (1.0 - p);
  Tensor out;
#if LOCKSTEP_HAVE_CUDA
  if (x.device().is_cuda()) {
    // The mask and the output in one pass, each Philox block drawn once.
    const Tensor src = x.contiguous();
    out = Tensor::empty(x.shape(), x.dtype(), x.device());
    ops::dispatch_float("dropout", x.dtype(), [&]<typename T>() {
      const lockstep::cuda::OnDevice on(x.device());
      ops::cuda::dropout_forward<T>(src.data_ptr<T>(), samples, per_sample, key.seed, key.stream, key.first_sample,
                                    keep_threshold(p), static_cast<T>(scale), mask.data_ptr<uint8_t>(),
                                    out.data_ptr<T>(), on.stream());
    });
  }
#endif
  if (!out.defined()) {
    draw_mask(key, p, samples, per_sample, mask.data<uint8_t>());
    out = apply_mask(x, mask, scale);
  }
  autograd::record("DropoutBackward", {x}, {out}, [mask, scale](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{apply_mask(g[0], mask, scale)};
  });
  return out;
}

}  // namespace lockstep
