#include "lockstep/io/sha256.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

// FIPS 180-2 test vectors.
TEST(Sha256, MatchesKnownAnswers) {
  EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

// A tensor hashes as its elements in logical order, whatever its strides.
TEST(Sha256, TensorHashIsItsRowMajorBytes) {
  const Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor transposed_twice = t.as_strided({3, 2}, {1, 3}, 0);  // [[1,4],[2,5],[3,6]]
  const std::vector<float> row_major = {1, 4, 2, 5, 3, 6};
  Sha256 hash;
  hash.update(transposed_twice);
  EXPECT_EQ(hash.hex_digest(), sha256_hex(row_major.data(), row_major.size() * sizeof(float)));
}

}  // namespace
}  // namespace lockstep
