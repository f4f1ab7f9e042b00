#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "lockstep/core/cuda/check.h"
#include "lockstep/core/error.h"
#include "lockstep/ops/cuda/random_kernels.h"

namespace lockstep::ops::cuda {
namespace {

using lockstep::cuda::grid_for;

constexpr int kThreads = 256;

// ---- Philox4x32-10, as core/philox.cpp computes it: the high and low halves of the two
// 32x32-bit products are __umulhi and the wrapping product.

__device__ __forceinline__ uint4 philox4x32(uint64_t seed, uint64_t stream, uint64_t counter) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(kMul0, c0), lo0 = kMul0 * c0;
    const uint32_t hi1 = __umulhi(kMul1, c2), lo1 = kMul1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return make_uint4(c0, c1, c2, c3);
}

__device__ __forceinline__ uint32_t word_of(const uint4& block, int w) {
  return w == 0 ? block.x : w == 1 ? block.y : w == 2 ? block.z : block.w;
}

// kCount consecutive words of the stream, from word `position` counted from word 0 of
// at.first_block: the words Philox::next_u32 would return in that order (crossing into the
// next block where needed; counters wrap at 2^64 as the CPU's do).
template <int kCount>
__device__ __forceinline__ void read_words(const PhiloxPosition& at, uint64_t position, uint32_t (&out)[kCount]) {
  uint64_t counter = at.first_block + position / 4;
  int w = static_cast<int>(position % 4);
  uint4 block = philox4x32(at.seed, at.stream, counter);
#pragma unroll
  for (int t = 0; t < kCount; ++t) {
    if (w == 4) {
      block = philox4x32(at.seed, at.stream, ++counter);
      w = 0;
    }
    out[t] = word_of(block, w++);
  }
}

// uints_to_unit_double: 53 random bits times 2^-53, both steps exact. The explicit rounding
// intrinsics keep the compiler from fusing the product into a later sum.
__device__ __forceinline__ double unit_double(uint32_t hi, uint32_t lo) {
  const uint64_t bits = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  return __dmul_rn(static_cast<double>(bits), 1.0 / 9007199254740992.0);
}

// a + b * c as the CPU's fill computes it: the product rounded, then the sum (ops/random.cpp
// compiles with -ffp-contract=off, and this file with --fmad=false: CMakeLists.txt).
__device__ __forceinline__ double multiply_add(double a, double b, double c) { return __dadd_rn(a, __dmul_rn(b, c)); }

template <typename T>
__global__ void uniform_kernel(T* __restrict__ out, int64_t n, PhiloxPosition at, double low, double span, T top,
                               T below_top) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t words[2];
    read_words(at, static_cast<uint64_t>(at.first_word) + 2 * static_cast<uint64_t>(i), words);
    const T value = static_cast<T>(multiply_add(low, span, unit_double(words[0], words[1])));
    out[i] = value < top ? value : below_top;  // rounding to T may reach high: keep [low, high)
  }
}

template <typename T>
__global__ void normal_kernel(T* __restrict__ out, int64_t n, PhiloxPosition at, double mean, double stddev) {
  // 2π as the CPU's 2.0 * M_PI folds it.
  constexpr double kTwoPi = 2.0 * 3.14159265358979323846;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t words[4];
    read_words(at, static_cast<uint64_t>(at.first_word) + 4 * static_cast<uint64_t>(i), words);
    const double u1 = __dsub_rn(1.0, unit_double(words[0], words[1]));  // (0, 1]
    const double u2 = unit_double(words[2], words[3]);
    const double z = __dmul_rn(sqrt(__dmul_rn(-2.0, log(u1))), cos(__dmul_rn(kTwoPi, u2)));
    out[i] = static_cast<T>(multiply_add(mean, stddev, z));
  }
}

__global__ void philox_blocks_kernel(uint64_t seed, uint64_t stream, uint64_t first_counter, int64_t count,
                                     uint32_t* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 block = philox4x32(seed, stream, first_counter + static_cast<uint64_t>(i));
    out[4 * i] = block.x;
    out[4 * i + 1] = block.y;
    out[4 * i + 2] = block.z;
    out[4 * i + 3] = block.w;
  }
}

// One thread per Philox block: 4 consecutive elements of one sample.
template <typename T>
__global__ void dropout_forward_kernel(const T* __restrict__ x, int64_t samples, int64_t per_sample, uint64_t seed,
                                       uint64_t stream, int64_t first_sample, uint32_t keep_threshold, T scale,
                                       uint8_t* __restrict__ mask, T* __restrict__ out) {
  const int64_t blocks_per_sample = (per_sample + 3) / 4;
  const int64_t total = samples * blocks_per_sample;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < total;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = g / blocks_per_sample, q = g % blocks_per_sample;
    const uint64_t counter = (static_cast<uint64_t>(first_sample + s) << 32) | static_cast<uint64_t>(q);
    const uint4 block = philox4x32(seed, stream, counter);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int64_t j = 4 * q + w;
      if (j >= per_sample) break;
      const int64_t index = s * per_sample + j;
      const bool kept = (word_of(block, w) >> 8) >= keep_threshold;
      mask[index] = kept ? 1 : 0;
      out[index] = kept ? x[index] * scale : T(0);
    }
  }
}

template <typename T>
__global__ void dropout_apply_kernel(const T* __restrict__ in, const uint8_t* __restrict__ mask, int64_t n, T scale,
                                     T* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = mask[i] ? in[i] * scale : T(0);
}

void check_position(const PhiloxPosition& at) {
  LOCKSTEP_CHECK(at.first_word >= 0 && at.first_word < 4)
      << "random fill: first_word must be 0 to 3 (a word of a four-word Philox block), got " << at.first_word;
}

// Queues kernel(args...) on stream with enough blocks for `work` grid-stride items (nothing
// when there are none), then checks the launch.
template <typename... Params, typename... Args>
void launch_over(int64_t work, CUstream_st* stream, void (*kernel)(Params...), const Args&... args) {
  if (work <= 0) return;
  kernel<<<grid_for(work, kThreads), kThreads, 0, stream>>>(args...);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void philox_blocks(uint64_t seed, uint64_t stream, uint64_t first_counter, int64_t count, uint32_t* out,
                   CUstream_st* cuda_stream) {
  launch_over(count, cuda_stream, philox_blocks_kernel, seed, stream, first_counter, count, out);
}

template <typename T>
void uniform_fill(T* out, int64_t n, const PhiloxPosition& at, double low, double high, CUstream_st* stream) {
  check_position(at);
  const T top = static_cast<T>(high);
  const T below_top = std::nextafter(top, static_cast<T>(low));
  launch_over(n, stream, uniform_kernel<T>, out, n, at, low, high - low, top, below_top);
}

template <typename T>
void normal_fill(T* out, int64_t n, const PhiloxPosition& at, double mean, double stddev, CUstream_st* stream) {
  check_position(at);
  launch_over(n, stream, normal_kernel<T>, out, n, at, mean, stddev);
}

template <typename T>
void dropout_forward(const T* x, int64_t samples, int64_t per_sample, uint64_t seed, uint64_t stream,
                     int64_t first_sample, uint32_t keep_threshold, T scale, uint8_t* mask, T* out,
                     CUstream_st* cuda_stream) {
  launch_over(samples * ((per_sample + 3) / 4), cuda_stream, dropout_forward_kernel<T>, x, samples, per_sample, seed,
              stream, first_sample, keep_threshold, scale, mask, out);
}

template <typename T>
void dropout_apply(const T* in, const uint8_t* mask, int64_t n, T scale, T* out, CUstream_st* stream) {
  launch_over(n, stream, dropout_apply_kernel<T>, in, mask, n, scale, out);
}

#define LOCKSTEP_INSTANTIATE(T)                                                                                        \
  template void uniform_fill<T>(T*, int64_t, const PhiloxPosition&, double, double, CUstream_st*);                     \
  template void normal_fill<T>(T*, int64_t, const PhiloxPosition&, double, double, CUstream_st*);                      \
  template void dropout_forward<T>(const T*, int64_t, int64_t, uint64_t, uint64_t, int64_t, uint32_t, T, uint8_t*, T*, \
                                   CUstream_st*);                                                                      \
  template void dropout_apply<T>(const T*, const uint8_t*, int64_t, T, T*, CUstream_st*);
LOCKSTEP_INSTANTIATE(float)
LOCKSTEP_INSTANTIATE(double)
#undef LOCKSTEP_INSTANTIATE

}  // namespace lockstep::ops::cuda
