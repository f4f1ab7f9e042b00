// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011, the generator of
// cuRAND and PyTorch's CUDA RNG). A draw is a pure function of (seed, stream, counter):
// no state to carry between devices, so initialization, shuffling and dropout masks keyed by
// global sample index come out the same on any number of devices.
#pragma once

#include <array>
#include <cstdint>

namespace lockstep {

// Well-known streams, so different purposes never share random numbers.
enum class RngStream : uint64_t {
  init = 1,     // parameter initialization (counter space split per parameter)
  shuffle = 2,  // data order, per epoch
  dropout = 3,  // dropout masks, per sample
  sample = 4,   // text generation, per position (nn::generate)
  user = 100,
};

// Four independent 32-bit words for (seed, stream, counter).
std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t stream, uint64_t counter);

// A uniform float in [0, 1) with 24 random bits / a double with 53.
inline float uint_to_unit_float(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }
inline double uints_to_unit_double(uint32_t hi, uint32_t lo) {
  return static_cast<double>((static_cast<uint64_t>(hi) << 21) ^ (lo >> 11)) * (1.0 / 9007199254740992.0);
}

// Sequential draws from one stream: the counter advances by one per block of four words.
// Its whole state is (seed, stream, counter), which a checkpoint saves.
class Philox {
 public:
  Philox(uint64_t seed, uint64_t stream, uint64_t counter = 0) : seed_(seed), stream_(stream), counter_(counter) {}
  uint32_t next_u32();
  uint64_t next_u64();
  double next_double();                 // [0, 1)
  uint64_t next_below(uint64_t bound);  // uniform in [0, bound), unbiased
  double next_normal();                 // standard normal (Box-Muller)
  uint64_t seed() const { return seed_; }
  uint64_t stream() const { return stream_; }
  uint64_t counter() const { return counter_; }  // blocks consumed, after buffered words are discarded

 private:
  uint64_t seed_, stream_, counter_;
  std::array<uint32_t, 4> block_{};
  int used_ = 4;
};

}  // namespace lockstep
