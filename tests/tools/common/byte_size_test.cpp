#include "tools/common/byte_size.h"

#include <gtest/gtest.h>

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

TEST(ByteSize, ReadsBinarySuffixesInAnyCase) {
  EXPECT_EQ(parse_byte_size("10G", "--m"), 10ull << 30);
  EXPECT_EQ(parse_byte_size("10GiB", "--m"), 10ull << 30);
  EXPECT_EQ(parse_byte_size("10gb", "--m"), 10ull << 30);
  EXPECT_EQ(parse_byte_size("512M", "--m"), 512ull << 20);
  EXPECT_EQ(parse_byte_size("1.5G", "--m"), 3ull << 29);
  EXPECT_EQ(parse_byte_size("4k", "--m"), 4096u);
  EXPECT_EQ(parse_byte_size("2T", "--m"), 2ull << 40);
  EXPECT_EQ(parse_byte_size("4096", "--m"), 4096u);
  EXPECT_EQ(parse_byte_size("17B", "--m"), 17u);
  EXPECT_EQ(parse_byte_size("0", "--m"), 0u);
}

TEST(ByteSize, RejectsWhatIsNotASize) {
  for (const char* bad : {"", "G", "-1G", "10X", "10 G", "ten", "1e30G", "nan", ".5G", "10GiBs"}) {
    try {
      parse_byte_size(bad, "--min-free-memory");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--min-free-memory takes a size like 10G"), std::string::npos) << e.what();
    }
  }
}

TEST(ByteSize, FormatsInTheLargestWholeUnit) {
  EXPECT_EQ(format_bytes(17), "17 B");
  EXPECT_EQ(format_bytes(512ull << 20), "512 MiB");
  EXPECT_EQ(format_bytes((19ull << 30) / 2), "9.5 GiB");
  EXPECT_EQ(format_bytes(80ull << 30), "80 GiB");
  EXPECT_EQ(format_bytes((1000ull << 20) + (1ull << 19)), "1000 MiB");
}

}  // namespace
}  // namespace lockstep::tools
