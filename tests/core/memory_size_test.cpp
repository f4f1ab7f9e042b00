// The one grammar of memory sizes, for flags (tools/common/byte_size.h) and environment
// variables (core/device_memory_limit.h): bytes or binary multiples, rounded to the byte.
#include "lockstep/core/memory_size.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

TEST(MemorySize, BytesOrBinaryMultiplesInAnyCase) {
  EXPECT_EQ(memory_size("4096"), 4096);
  EXPECT_EQ(memory_size("17B"), 17);
  EXPECT_EQ(memory_size("4k"), 4096);
  EXPECT_EQ(memory_size("2kb"), 2048);
  EXPECT_EQ(memory_size("512M"), int64_t{512} << 20);
  EXPECT_EQ(memory_size("1.5GiB"), int64_t{3} << 29);
  EXPECT_EQ(memory_size("10gb"), int64_t{10} << 30);
  EXPECT_EQ(memory_size("2T"), int64_t{2} << 40);
  EXPECT_EQ(memory_size("0"), 0);
  EXPECT_EQ(memory_size("0.6"), 1);  // to the nearest byte
}

TEST(MemorySize, WhatIsNotASizeIsNothing) {
  for (const char* bad : {"", "G", "-1G", "+1G", " 1G", "10X", "10 G", "ten", "lots", "1e30G", "1e30T", "nan", "inf",
                          ".5G", "10GiBs", "5iB", "5Q", "8E"}) {
    EXPECT_FALSE(memory_size(bad).has_value()) << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace lockstep
