// How a collective cuts n elements among its ranks: rank r takes one contiguous slice,
// cut on 64-byte boundaries (no two ranks write one cache line; vector loads stay aligned),
// the slices as equal as the boundaries allow, the last ones shorter or empty. A reduction
// folds each element alike whoever holds it, so the cut never changes the bits; it is one
// cut everywhere so that a slice of a device's share lines up with the backend's.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep::comm {

struct Slice {
  int64_t begin = 0;
  int64_t size = 0;
};

inline constexpr int64_t kSliceAlignBytes = 64;

// Rank `rank` of `ranks`'s slice of n elements of element_size bytes. Rank 0's is empty only
// when n is.
Slice slice_of(int64_t n, int rank, int ranks, size_t element_size);

}  // namespace lockstep::comm
