#include "lockstep/data/idx.h"

#include <gtest/gtest.h>

#include <cstring>

#include "io/test_files.h"

namespace lockstep {
namespace {

using testing::Bytes;
using testing::expect_error;
using testing::TempDir;

// An IDX file built byte by byte: magic, big-endian dimensions, payload.
Bytes idx_bytes(uint8_t type, const std::vector<uint32_t>& dims, const Bytes& payload) {
  Bytes out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(d >> shift));
  }
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

Bytes iota_bytes(size_t n, uint8_t start = 0) {
  Bytes out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(start + 7 * i);
  return out;
}

TEST(Idx, ReadsUnsignedBytesPlainAndGzip) {
  TempDir dir;
  const Bytes payload = iota_bytes(24, 3);
  const Bytes file = idx_bytes(0x08, {2, 3, 4}, payload);
  testing::write_bytes(dir.file("plain.idx"), file);
  testing::write_gzip(dir.file("packed.idx.gz"), file);
  for (const std::string name : {"plain.idx", "packed.idx.gz"}) {
    const Tensor t = read_idx(dir.file(name));
    EXPECT_EQ(t.dtype(), DType::u8) << name;
    EXPECT_EQ(t.shape(), (Shape{2, 3, 4})) << name;
    EXPECT_EQ(t.to_vector<uint8_t>(), std::vector<uint8_t>(payload.begin(), payload.end())) << name;
  }
}

TEST(Idx, ReadsRankOneAndEmpty) {
  TempDir dir;
  testing::write_gzip(dir.file("labels.gz"), idx_bytes(0x08, {5}, {9, 0, 3, 255, 1}));
  EXPECT_EQ(read_idx(dir.file("labels.gz")).to_vector<uint8_t>(), (std::vector<uint8_t>{9, 0, 3, 255, 1}));
  testing::write_bytes(dir.file("none.idx"), idx_bytes(0x08, {0, 28}, {}));
  const Tensor none = read_idx(dir.file("none.idx"));
  EXPECT_EQ(none.shape(), (Shape{0, 28}));
}

TEST(Idx, DecodesBigEndianWiderTypes) {
  TempDir dir;
  // int: 0x01020304 and -2; float: 1.5 = 0x3FC00000; double: -0.25 = 0xBFD0000000000000.
  testing::write_bytes(dir.file("int"), idx_bytes(0x0C, {2}, {0x01, 0x02, 0x03, 0x04, 0xFF, 0xFF, 0xFF, 0xFE}));
  testing::write_bytes(dir.file("float"), idx_bytes(0x0D, {1}, {0x3F, 0xC0, 0x00, 0x00}));
  testing::write_gzip(dir.file("double.gz"), idx_bytes(0x0E, {1}, {0xBF, 0xD0, 0, 0, 0, 0, 0, 0}));
  testing::write_bytes(dir.file("short"), idx_bytes(0x0B, {2}, {0xFF, 0xFE, 0x01, 0x00}));
  testing::write_bytes(dir.file("sbyte"), idx_bytes(0x09, {2}, {0x80, 0x7F}));

  const Tensor ints = read_idx(dir.file("int"));
  EXPECT_EQ(ints.dtype(), DType::i32);
  EXPECT_EQ(ints.to_vector<int32_t>(), (std::vector<int32_t>{0x01020304, -2}));
  const Tensor floats = read_idx(dir.file("float"));
  EXPECT_EQ(floats.dtype(), DType::f32);
  EXPECT_EQ(floats.to_vector<float>(), (std::vector<float>{1.5f}));
  const Tensor doubles = read_idx(dir.file("double.gz"));
  EXPECT_EQ(doubles.dtype(), DType::f64);
  EXPECT_EQ(doubles.to_vector<double>(), (std::vector<double>{-0.25}));
  EXPECT_EQ(read_idx(dir.file("short")).to_vector<int32_t>(), (std::vector<int32_t>{-2, 256}));
  EXPECT_EQ(read_idx(dir.file("sbyte")).to_vector<int32_t>(), (std::vector<int32_t>{-128, 127}));
}

TEST(Idx, MissingFileNamesThePath) {
  TempDir dir;
  const std::string path = dir.file("absent-idx1-ubyte.gz");
  expect_error([&] { read_idx(path); }, {path, "No such file"});
  expect_error([&] { read_idx(dir.path()); }, {dir.path(), "not a regular file"});
}

TEST(Idx, BadMagicIsAnError) {
  TempDir dir;
  const std::string path = dir.file("text.gz");
  testing::write_gzip(path, {'h', 'e', 'l', 'l', 'o', '!'});
  expect_error([&] { read_idx(path); }, {path, "bad magic", "68 65 6c 6c"});
  testing::write_bytes(dir.file("short"), {0, 0});
  expect_error([&] { read_idx(dir.file("short")); }, {dir.file("short"), "too short"});
  testing::write_bytes(dir.file("empty"), {});
  expect_error([&] { read_idx(dir.file("empty")); }, {dir.file("empty"), "empty"});
}

TEST(Idx, UnsupportedTypeCodeIsAnError) {
  TempDir dir;
  const std::string path = dir.file("odd.idx");
  testing::write_bytes(path, idx_bytes(0x07, {1}, {0}));
  expect_error([&] { read_idx(path); }, {path, "unsupported type code 0x07"});
}

TEST(Idx, TruncatedPayloadSaysHowMuchIsMissing) {
  TempDir dir;
  const Bytes file = idx_bytes(0x08, {2, 3, 4}, iota_bytes(10));  // 24 bytes promised, 10 present
  testing::write_bytes(dir.file("cut.idx"), file);
  testing::write_gzip(dir.file("cut.idx.gz"), file);
  for (const std::string name : {"cut.idx", "cut.idx.gz"}) {
    expect_error([&] { read_idx(dir.file(name)); },
                 {dir.file(name), "truncated payload", "expected 24 bytes", "got 10"});
  }
  // Dimensions cut short inside the header.
  Bytes header = idx_bytes(0x08, {2, 3, 4}, {});
  header.resize(9);
  testing::write_bytes(dir.file("cut-header"), header);
  expect_error([&] { read_idx(dir.file("cut-header")); }, {"truncated header", "12 bytes of dimensions, got 5"});
}

TEST(Idx, HugeDimensionsInATinyFileFailWithoutAllocating) {
  TempDir dir;
  // 4e12 bytes promised by a file of a few dozen bytes: reported, not allocated.
  testing::write_gzip(dir.file("huge.gz"), idx_bytes(0x08, {2000000, 2000000}, iota_bytes(100)));
  expect_error([&] { read_idx(dir.file("huge.gz")); },
               {"truncated payload", "expected 4000000000000 bytes", "got 100"});
  testing::write_bytes(dir.file("overflow"), idx_bytes(0x0E, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {}));
  expect_error([&] { read_idx(dir.file("overflow")); }, {"too large"});
}

TEST(Idx, TrailingBytesAreAnError) {
  TempDir dir;
  testing::write_bytes(dir.file("long.idx"), idx_bytes(0x08, {3}, {1, 2, 3, 4}));
  expect_error([&] { read_idx(dir.file("long.idx")); }, {dir.file("long.idx"), "bytes after the payload"});
}

TEST(Idx, CorruptGzipStreamIsAnError) {
  TempDir dir;
  const std::string good = dir.file("good.gz");
  testing::write_gzip(good, idx_bytes(0x08, {64, 64}, iota_bytes(4096)));
  const Bytes packed = testing::read_bytes(good);
  ASSERT_GT(packed.size(), 40u);

  // Garbage in the deflate data (after the 10-byte gzip header).
  Bytes damaged = packed;
  for (size_t i = 10; i < 30; ++i) damaged[i] ^= 0x5A;
  testing::write_bytes(dir.file("damaged.gz"), damaged);
  expect_error([&] { read_idx(dir.file("damaged.gz")); }, {dir.file("damaged.gz"), "corrupt gzip stream"});

  // A download cut in the middle of the compressed stream.
  const Bytes cut(packed.begin(), packed.begin() + static_cast<std::ptrdiff_t>(packed.size() / 2));
  testing::write_bytes(dir.file("cut.gz"), cut);
  expect_error([&] { read_idx(dir.file("cut.gz")); },
               {dir.file("cut.gz"), "corrupt gzip stream (unexpected end of file)"});

  // A bad CRC in the trailer: the data decompress but do not check out.
  Bytes bad_crc = packed;
  bad_crc[packed.size() - 8] ^= 0xFF;
  testing::write_bytes(dir.file("crc.gz"), bad_crc);
  expect_error([&] { read_idx(dir.file("crc.gz")); }, {dir.file("crc.gz"), "corrupt gzip stream"});

  // Bytes after the gzip stream that are not another member.
  Bytes trailing = packed;
  for (const char c : std::string("GARBAGE")) trailing.push_back(static_cast<uint8_t>(c));
  testing::write_bytes(dir.file("trailing.gz"), trailing);
  expect_error([&] { read_idx(dir.file("trailing.gz")); },
               {dir.file("trailing.gz"), "7 bytes after its gzip stream that are not gzip data"});
}

// Concatenated gzip members (`cat a.gz b.gz`) are one file, as gunzip reads them.
TEST(Idx, GzipMembersInARowAreOneFile) {
  TempDir dir;
  const Bytes file = idx_bytes(0x08, {2, 3}, {1, 2, 3, 4, 5, 6});
  testing::write_gzip(dir.file("head.gz"), Bytes(file.begin(), file.begin() + 9));
  testing::write_gzip(dir.file("tail.gz"), Bytes(file.begin() + 9, file.end()));
  Bytes joined = testing::read_bytes(dir.file("head.gz"));
  const Bytes tail = testing::read_bytes(dir.file("tail.gz"));
  joined.insert(joined.end(), tail.begin(), tail.end());
  testing::write_bytes(dir.file("joined.gz"), joined);
  const Tensor t = read_idx(dir.file("joined.gz"));
  ASSERT_EQ(t.shape(), (Shape{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.data<uint8_t>()[i], i + 1);
}

}  // namespace
}  // namespace lockstep
