#include "lockstep/core/philox.h"

#include <cmath>

namespace lockstep {

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t stream, uint64_t counter) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {c0, c1, c2, c3};
}

uint32_t Philox::next_u32() {
  if (used_ == 4) {
    block_ = philox4x32(seed_, stream_, counter_++);
    used_ = 0;
  }
  return block_[static_cast<size_t>(used_++)];
}

uint64_t Philox::next_u64() {
  const uint64_t hi = next_u32();
  return (hi << 32) | next_u32();
}

double Philox::next_double() {
  const uint32_t hi = next_u32();
  return uints_to_unit_double(hi, next_u32());
}

uint64_t Philox::next_below(uint64_t bound) {
  // Rejection sampling: drop the top partial range so every value is equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do {
    x = next_u64();
  } while (x >= limit);
  return x % bound;
}

double Philox::next_normal() {
  const double u1 = 1.0 - next_double();  // (0, 1]
  const double u2 = next_double();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace lockstep
