#include "lockstep/io/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <sstream>

#include "io/test_files.h"
#include "lockstep/core/philox.h"

namespace lockstep {
namespace {

using testing::Bytes;
using testing::expect_error;
using testing::TempDir;

Bytes raw_bytes(const Tensor& t) {
  const Tensor dense = Tensor::empty(t.shape(), t.dtype());
  dense.copy_from(t);
  const auto* p = static_cast<const uint8_t*>(dense.numel() ? dense.raw_data() : nullptr);
  return p ? Bytes(p, p + dense.nbytes()) : Bytes();
}

// A tensor of `dtype` with varied values (random for floats, signed spread for integers).
Tensor sample_tensor(DType dtype, const Shape& shape, uint64_t seed) {
  const Tensor values = Tensor::empty(shape, DType::f64);
  Philox rng(seed, 5);
  for (int64_t i = 0; i < values.numel(); ++i) {
    const double u = rng.next_double();
    const double range = dtype == DType::u8 ? 256 : dtype == DType::i32 ? 4e9 : 2e15;
    values.data<double>()[i] =
        is_floating(dtype) ? 200 * u - 100 : std::floor(range * u - (dtype == DType::u8 ? 0 : range / 2));
  }
  const Tensor out = Tensor::empty(shape, dtype);
  out.copy_from(values);
  return out;
}

// The file as the spec lays it out: little-endian u64 header length, the header padded
// with spaces to a multiple of 8, then the data.
Bytes encode_by_hand(std::string header, const Bytes& data) {
  while (header.size() % 8 != 0) header += ' ';
  Bytes out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

TEST(Safetensors, RoundTripsEveryDtypeInOrder) {
  TempDir dir;
  NamedTensors tensors;
  uint64_t seed = 1;
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}) {
    tensors.emplace_back(std::string("t.") + dtype_name(d), sample_tensor(d, {3, 5}, seed++));
  }
  tensors.emplace_back("scalar", Tensor::scalar(2.5, DType::f64));
  tensors.emplace_back("empty", Tensor::empty({0, 4}, DType::f32));
  tensors.emplace_back("a.odd.size", sample_tensor(DType::u8, {3}, 99));  // later tensors start unaligned
  tensors.emplace_back("z.after.odd", sample_tensor(DType::f32, {2, 2}, 100));
  const Metadata metadata = {{"step", "120"}, {"note", "x=\"1\"\n\u00e9"}};
  save_safetensors(dir.file("all.safetensors"), tensors, metadata);

  const TensorFile loaded = load_safetensors(dir.file("all.safetensors"));
  EXPECT_EQ(loaded.metadata, metadata);
  ASSERT_EQ(loaded.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, expected] = tensors[i];
    const auto& [got_name, got] = loaded.tensors[i];
    EXPECT_EQ(got_name, name);
    EXPECT_EQ(got.dtype(), expected.dtype()) << name;
    EXPECT_EQ(got.shape(), expected.shape()) << name;
    EXPECT_EQ(raw_bytes(got), raw_bytes(expected)) << name;
  }
  EXPECT_TRUE(loaded.contains("t.bf16"));
  EXPECT_FALSE(loaded.contains("t.f8"));
  expect_error([&] { loaded.at("missing"); }, {"missing", "t.f32"});
}

TEST(Safetensors, WritesExactlyTheSpecifiedBytes) {
  TempDir dir;
  const NamedTensors tensors = {{"w", Tensor::from_vector<float>({1.0f, -2.0f}, {2})},
                                {"b", Tensor::from_vector<uint8_t>({1, 2, 3}, {3, 1})}};
  save_safetensors(dir.file("tiny.safetensors"), tensors, {{"format", "pt"}});
  const std::string header = R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"U8","shape":[3,1],"data_offsets":[8,11]}})";
  // 1.0f = 0x3F800000 and -2.0f = 0xC0000000, little-endian.
  const Bytes expected = encode_by_hand(header, {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0xC0, 1, 2, 3});
  EXPECT_EQ(testing::read_bytes(dir.file("tiny.safetensors")), expected);

  // No metadata: no __metadata__ entry at all.
  save_safetensors(dir.file("plain.safetensors"), {{"x", Tensor::from_vector<int64_t>({-1}, {1})}});
  EXPECT_EQ(testing::read_bytes(dir.file("plain.safetensors")),
            encode_by_hand(R"({"x":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", Bytes(8, 0xFF)));

  // The metadata alone, read from the header.
  EXPECT_EQ(load_safetensors_metadata(dir.file("tiny.safetensors")), (Metadata{{"format", "pt"}}));
  EXPECT_TRUE(load_safetensors_metadata(dir.file("plain.safetensors")).empty());
}

TEST(Safetensors, ReadsAHandEncodedFileInAnyOrder) {
  TempDir dir;
  // Header order differs from data order; whitespace in the JSON; bf16 1.0 = 0x3F80.
  const std::string header = R"({ "b" : {"dtype":"BF16","shape":[2],"data_offsets":[4,8]},
    "a":{"data_offsets":[0,4],"shape":[],"dtype":"I32"}, "__metadata__": {"k": "v"} })";
  testing::write_bytes(dir.file("f"), encode_by_hand(header, {0xFE, 0xFF, 0xFF, 0xFF, 0x80, 0x3F, 0x00, 0xC0}));
  const TensorFile file = load_safetensors(dir.file("f"));
  ASSERT_EQ(file.tensors.size(), 2u);
  EXPECT_EQ(file.tensors[0].first, "b");
  EXPECT_EQ(file.at("b").to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(file.at("a").shape(), Shape{});
  EXPECT_EQ(file.at("a").item(), -2.0);
  EXPECT_EQ(file.metadata, (Metadata{{"k", "v"}}));
}

TEST(Safetensors, NonContiguousTensorsAreStoredContiguously) {
  TempDir dir;
  const Tensor matrix = Tensor::from_vector<double>({0, 1, 2, 3, 4, 5}, {2, 3});
  const Tensor transposed = matrix.as_strided({3, 2}, {1, 3}, 0);
  save_safetensors(dir.file("t"), {{"t", transposed}});
  const Tensor loaded = load_safetensors(dir.file("t")).at("t");
  EXPECT_EQ(loaded.shape(), (Shape{3, 2}));
  EXPECT_EQ(loaded.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(Safetensors, RejectsBadNamesOnWrite) {
  TempDir dir;
  const Tensor x = Tensor::zeros({1});
  expect_error([&] { save_safetensors(dir.file("a"), {{"x", x}, {"x", x}}); }, {"two tensors", "'x'"});
  expect_error([&] { save_safetensors(dir.file("a"), {{"__metadata__", x}}); }, {"__metadata__"});
  expect_error([&] { save_safetensors(dir.file("a"), {{"", x}}); }, {"cannot be named"});
  expect_error([&] { save_safetensors(dir.file("a"), {{"u", Tensor()}}); }, {"'u'", "undefined"});
  expect_error([&] { save_safetensors(dir.file("no/such/dir/a"), {{"x", x}}); }, {"no/such/dir/a"});
  expect_error([&] { save_safetensors(dir.file("a"), {{"x", x}}, {{"note", "\xff"}}); }, {"UTF-8"});
  EXPECT_TRUE(dir.entries().empty());
}

// Each corrupt file fails with an Error naming the file and, where there is one, the tensor.
TEST(Safetensors, RejectsCorruptFiles) {
  TempDir dir;
  const Bytes eight(8, 0);
  struct Case {
    const char* name;
    Bytes bytes;
    std::vector<std::string> message;
  };
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape, int begin, int end) {
    std::ostringstream out;  // (string operator+ chains trip a GCC 12 -Wrestrict false positive)
    out << '"' << name << R"(":{"dtype":")" << dtype << R"(","shape":)" << shape << R"(,"data_offsets":[)" << begin
        << "," << end << "]}";
    return out.str();
  };
  auto object = [](std::initializer_list<std::string> entries) {
    std::ostringstream out;
    out << '{';
    for (const std::string& e : entries) out << (&e == entries.begin() ? "" : ",") << e;
    out << '}';
    return out.str();
  };
  Bytes huge_length = encode_by_hand("{}", {});
  huge_length[0] = 0xF0;  // a header far longer than the file
  huge_length[5] = 0x01;
  const std::vector<Case> cases = {
      {"short", {1, 2, 3}, {"too few"}},
      {"length", huge_length, {"declares a header of", "truncated"}},
      {"not-json", encode_by_hand("{\"a\": [1, 2", {}), {"not valid JSON"}},
      {"not-object", encode_by_hand("[1, 2]", {}), {"does not start with '{'"}},
      {"dtype", encode_by_hand(object({entry("mask", "BOOL", "[2]", 0, 2)}), {1, 0}), {"'mask'", "BOOL"}},
      {"range", encode_by_hand(object({entry("w", "F32", "[4]", 0, 16)}), eight), {"'w'", "reach past"}},
      {"size", encode_by_hand(object({entry("w", "F32", "[3]", 0, 8)}), eight), {"'w'", "needs 12"}},
      {"overlap",
       encode_by_hand(object({entry("a", "F32", "[2]", 0, 8), entry("b", "F32", "[1]", 4, 8)}), eight),
       {"overlaps"}},
      {"hole", encode_by_hand(object({entry("a", "F32", "[1]", 4, 8)}), eight), {"'a'", "belong to no tensor"}},
      {"tail", encode_by_hand(object({entry("a", "F32", "[1]", 0, 4)}), eight), {"cover 4 bytes", "holds 8"}},
      {"backwards", encode_by_hand(object({entry("a", "U8", "[0]", 8, 0)}), eight), {"'a'", "end before"}},
      {"negative", encode_by_hand(object({entry("a", "U8", "[-2]", 0, 0)}), {}), {"'a'", "non-negative"}},
      {"no-shape", encode_by_hand(R"({"a":{"dtype":"U8","data_offsets":[0,0]}})", {}), {"'a'", "'shape'"}},
      {"metadata", encode_by_hand(R"({"__metadata__":{"step":3}})", {}), {"'step'", "must be a string"}},
      // A 0 does not let a size whose strides overflow 64 bits through.
      {"zero-then-huge",
       encode_by_hand(object({entry("a", "U8", "[0,4294967296,4294967296]", 0, 0)}), {}),
       {"'a'", "too large"}},
      // A header nested 100,000 deep: refused before the recursive parser sees it.
      {"deep",
       encode_by_hand("{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}", {}),
       {"nests 100001 levels deep"}},
      // A long value is quoted in part: the error stays one short line.
      {"long-dtype",
       encode_by_hand(object({entry("a", std::string(5000, 'X'), "[1]", 0, 4)}), {0, 0, 0, 0}),
       {"'a'", "XXX..."}},
      {"long-number",
       encode_by_hand(object({entry("a", "F32", "[" + std::string(5000, '1') + "]", 0, 4)}), {}),
       {"not valid JSON", "..."}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file(c.name);
    testing::write_bytes(path, c.bytes);
    try {
      load_safetensors(path);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(path), std::string::npos) << message;
      for (const std::string& part : c.message) EXPECT_NE(message.find(part), std::string::npos) << message;
      EXPECT_LT(message.size(), 400u) << message.substr(0, 400);
    }
  }
  // A FIFO is refused at once instead of waiting for a writer.
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { load_safetensors(fifo); }, {fifo, "not a regular file"});
  expect_error([&] { load_safetensors(dir.file("absent")); }, {dir.file("absent"), "No such file"});
}

}  // namespace
}  // namespace lockstep
