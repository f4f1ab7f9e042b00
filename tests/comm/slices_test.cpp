// The one cut of n elements among ranks that the collectives and the layouts share.
#include "lockstep/comm/slices.h"

#include <gtest/gtest.h>

namespace lockstep::comm {
namespace {

TEST(Slices, CoverTheElementsInOrderOnAlignedBoundaries) {
  for (const size_t element : {size_t{2}, size_t{4}, size_t{8}}) {
    const int64_t align = kSliceAlignBytes / static_cast<int64_t>(element);
    for (const int ranks : {1, 2, 3, 7, 8}) {
      for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{1000}, int64_t{100003}}) {
        int64_t next = 0;
        for (int r = 0; r < ranks; ++r) {
          const Slice s = slice_of(n, r, ranks, element);
          EXPECT_EQ(s.begin, next) << n << " elements, rank " << r << " of " << ranks;
          EXPECT_GE(s.size, 0);
          if (s.size > 0) {
            EXPECT_EQ(s.begin % align, 0) << n << " elements, rank " << r;
          }
          next = s.begin + s.size;
        }
        EXPECT_EQ(next, n) << n << " elements over " << ranks << " ranks";
        EXPECT_EQ(slice_of(n, 0, ranks, element).size > 0, n > 0);
      }
    }
  }
  // As equal as the boundaries allow: 1000 f32 over 3 ranks are 336, 336, 328.
  EXPECT_EQ(slice_of(1000, 0, 3, 4).size, 336);
  EXPECT_EQ(slice_of(1000, 2, 3, 4).size, 328);
}

}  // namespace
}  // namespace lockstep::comm
