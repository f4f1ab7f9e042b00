// Philox4x32-10 on the GPU, and the random fills and dropout masks built on it. The words
// are core/philox.cpp's, bit for bit (integer arithmetic only), and the conversions to
// numbers are the CPU's formulas, so a fill or a mask drawn on a GPU equals the CPU's
// (uniform values and masks exactly; normal values up to the last bits of log and cos).
// Callable from plain C++ (no CUDA headers needed).
#pragma once

#include <cstdint>

struct CUstream_st;  // = cudaStream_t

namespace lockstep::ops::cuda {

// out[4 * i + w] = word w of philox4x32(seed, stream, first_counter + i), for i < count.
void philox_blocks(uint64_t seed, uint64_t stream, uint64_t first_counter, int64_t count, uint32_t* out,
                   CUstream_st* cuda_stream);

// Where a fill starts reading a Philox stream: word first_word (0 to 3) of the block at
// counter first_block, continuing through the following words and blocks in order, as
// Philox::next_u32 reads them.
struct PhiloxPosition {
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t first_block = 0;
  int first_word = 0;
};

// Element i (of n, in order) = low + (high - low) * u, u the double of words 2i and 2i + 1
// (uints_to_unit_double), the product and the sum each rounded (never one fused multiply-add,
// as on the CPU), rounded to T, and the largest T below high where rounding reached
// high: ops/random.cpp's uniform_.
template <typename T>
void uniform_fill(T* out, int64_t n, const PhiloxPosition& at, double low, double high, CUstream_st* stream);

// Element i = mean + stddev * z (product and sum each rounded), z = Philox::next_normal's
// Box-Muller value from words 4i to 4i + 3, rounded to T: ops/random.cpp's normal_.
template <typename T>
void normal_fill(T* out, int64_t n, const PhiloxPosition& at, double mean, double stddev, CUstream_st* stream);

// Dropout over x [samples, per_sample]: element j of sample s is kept when word j % 4 of
// philox4x32(seed, stream, (first_sample + s) << 32 | j / 4), shifted right by 8, is at
// least keep_threshold; mask = 1 where kept, else 0, and out = kept ? x · scale : 0.
template <typename T>
void dropout_forward(const T* x, int64_t samples, int64_t per_sample, uint64_t seed, uint64_t stream,
                     int64_t first_sample, uint32_t keep_threshold, T scale, uint8_t* mask, T* out,
                     CUstream_st* cuda_stream);

// out = mask ? in · scale : 0 over n elements (dropout's backward, and its forward from a mask).
template <typename T>
void dropout_apply(const T* in, const uint8_t* mask, int64_t n, T scale, T* out, CUstream_st* stream);

}  // namespace lockstep::ops::cuda
