#include "lockstep/ops/dropout.h"

#include <gtest/gtest.h>

#include <set>

#include "lockstep/core/philox.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::expect_all_close;
using testing::random_f64;

TEST(Dropout, IdentityWhenNotTrainingOrPZero) {
  const Tensor x = random_f64({4, 3}, 1);
  EXPECT_TRUE(dropout(x, 0.5, false, {}).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0, true, {}).is_same(x));
}

TEST(Dropout, KeepsAboutOneMinusPAndScalesTheRest) {
  const Tensor x = Tensor::ones({200, 500});
  for (double p : {0.1, 0.5, 0.8}) {
    const auto values = dropout(x, p, true, {7, dropout_stream(0, 0), 0}).to_vector<float>();
    int64_t kept = 0;
    for (float v : values) {
      if (v != 0) {
        ++kept;
        EXPECT_FLOAT_EQ(v, static_cast<float>(1.0 / (1.0 - p)));
      }
    }
    // 100000 Bernoulli draws: the standard deviation of the fraction is below 0.0016.
    EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(values.size()), 1.0 - p, 0.01) << "p = " << p;
  }
}

TEST(Dropout, SampleMaskDoesNotDependOnItsBatch) {
  const Tensor batch = Tensor::ones({6, 3, 5}, DType::f64);
  const DropoutKey key{42, dropout_stream(3, 17), 100};
  const auto whole = dropout(batch, 0.5, true, key).to_vector<double>();
  // Sample 104 alone, and samples 102..105 as another micro-batch.
  const auto alone =
      dropout(Tensor::ones({1, 3, 5}, DType::f64), 0.5, true, {key.seed, key.stream, 104}).to_vector<double>();
  const auto slice_of_four =
      dropout(Tensor::ones({4, 3, 5}, DType::f64), 0.5, true, {key.seed, key.stream, 102}).to_vector<double>();
  for (size_t j = 0; j < 15; ++j) {
    EXPECT_EQ(alone[j], whole[4 * 15 + j]) << "element " << j;
    EXPECT_EQ(slice_of_four[2 * 15 + j], whole[4 * 15 + j]) << "element " << j;
  }
  // f32 and f64 draw the same mask.
  const auto whole32 = dropout(batch.to(DType::f32), 0.5, true, key).to_vector<double>();
  EXPECT_EQ(whole32, whole);
}

TEST(Dropout, MaskComesFromPhiloxByGlobalSampleAndElement) {
  const double p = 0.3;
  const DropoutKey key{5, dropout_stream(1, 2), 9};
  const auto out = dropout(Tensor::ones({2, 7}, DType::f64), p, true, key).to_vector<double>();
  for (uint64_t s = 0; s < 2; ++s) {
    for (uint64_t j = 0; j < 7; ++j) {
      const auto words = philox4x32(key.seed, key.stream, ((9 + s) << 32) | (j / 4));
      const bool kept = uint_to_unit_float(words[j % 4]) >= p;
      EXPECT_EQ(out[s * 7 + j], kept ? 1.0 / (1.0 - p) : 0.0) << "sample " << s << " element " << j;
    }
  }
}

TEST(Dropout, DifferentStreamsAndSeedsGiveDifferentMasks) {
  const Tensor x = Tensor::ones({4, 64});
  const auto a = dropout(x, 0.5, true, {1, dropout_stream(0, 0), 0}).to_vector<float>();
  EXPECT_NE(a, dropout(x, 0.5, true, {1, dropout_stream(0, 1), 0}).to_vector<float>());
  EXPECT_NE(a, dropout(x, 0.5, true, {1, dropout_stream(1, 0), 0}).to_vector<float>());
  EXPECT_NE(a, dropout(x, 0.5, true, {2, dropout_stream(0, 0), 0}).to_vector<float>());
}

TEST(Dropout, GradientIsTheMaskTimesScale) {
  Tensor x = Tensor::ones({3, 8}, DType::f64);
  x.set_requires_grad(true);
  const DropoutKey key{3, dropout_stream(0, 5), 0};
  const Tensor out = dropout(x, 0.25, true, key);
  out.backward(Tensor::ones({3, 8}, DType::f64));
  expect_all_close(x.grad(), out.to_vector<double>(), 0, 0);

  Tensor y = random_f64({3, 2, 2}, 4);
  y.set_requires_grad(true);
  testing::expect_gradients_match([&](const std::vector<Tensor>& in) { return dropout(in[0], 0.4, true, key); }, {y});
}

TEST(Dropout, StreamIdsAreDistinctAndAvoidFixedStreams) {
  std::set<uint64_t> ids;
  for (uint64_t layer = 0; layer < 20; ++layer)
    for (uint64_t step = 0; step < 50; ++step) ids.insert(dropout_stream(layer, step));
  EXPECT_EQ(ids.size(), 1000u);
  for (RngStream fixed : {RngStream::init, RngStream::shuffle, RngStream::dropout, RngStream::user})
    EXPECT_EQ(ids.count(static_cast<uint64_t>(fixed)), 0u);
  EXPECT_NE(dropout_stream(1, 0), dropout_stream(0, uint64_t{1} << 39));
  EXPECT_THROW(dropout_stream(uint64_t{1} << 21, 0), Error);
  EXPECT_THROW(dropout_stream(0, uint64_t{1} << 40), Error);
}

TEST(Dropout, RejectsPOutsideTheUnitInterval) {
  const Tensor x = Tensor::ones({2, 2});
  for (double p : {1.0, -0.1, 1.5}) {
    try {
      dropout(x, p, true, {});
      FAIL() << "no error for p = " << p;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[0, 1)"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(dropout(Tensor::scalar(1.0), 0.5, true, {}), Error);
}

}  // namespace
}  // namespace lockstep
