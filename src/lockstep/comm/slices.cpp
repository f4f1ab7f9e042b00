#include "lockstep/comm/slices.h"

#include <algorithm>

namespace lockstep::comm {

Slice slice_of(int64_t n, int rank, int ranks, size_t element_size) {
  const int64_t align = std::max<int64_t>(1, kSliceAlignBytes / static_cast<int64_t>(element_size));
  const int64_t slice = ((n + ranks - 1) / ranks + align - 1) / align * align;
  const int64_t begin = std::min(n, rank * slice);
  return {begin, std::min(n, begin + slice) - begin};
}

}  // namespace lockstep::comm
