#include "lockstep/ops/embedding.h"

#include <gtest/gtest.h>

#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::expect_all_close;
using testing::random_f64;

TEST(Embedding, GathersRowsForAnyIndexShape) {
  const Tensor w = random_f64({5, 3}, 1);
  const auto wv = w.to_vector<double>();
  const std::vector<int64_t> idx = {4, 0, 2, 2, 1, 4};
  for (DType index_dtype : {DType::i64, DType::i32}) {
    const Tensor indices = Tensor::from_vector<int64_t>(idx, {2, 3}).to(index_dtype);
    const Tensor out = embedding(indices, w);
    EXPECT_EQ(out.shape(), (Shape{2, 3, 3}));
    std::vector<double> expected;
    for (int64_t i : idx)
      for (int64_t d = 0; d < 3; ++d) expected.push_back(wv[static_cast<size_t>(i * 3 + d)]);
    expect_all_close(out, expected, 0, 0);
  }
  EXPECT_EQ(embedding(Tensor::from_vector<int64_t>({3}, {}), w).shape(), (Shape{3}));
}

TEST(Embedding, GradientScatterAddsRepeatedRows) {
  Tensor w = random_f64({4, 2}, 2);
  w.set_requires_grad(true);
  const std::vector<int64_t> idx = {1, 3, 1, 1, 0};
  const Tensor out = embedding(Tensor::from_vector<int64_t>(idx, {5}), w);
  const Tensor dy = random_f64({5, 2}, 3);
  out.backward(dy);
  const auto g = dy.to_vector<double>();
  std::vector<double> expected(8, 0.0);
  for (size_t i = 0; i < idx.size(); ++i)
    for (size_t d = 0; d < 2; ++d) expected[static_cast<size_t>(idx[i]) * 2 + d] += g[i * 2 + d];
  expect_all_close(w.grad(), expected, 1e-15, 1e-15);
}

TEST(Embedding, GradientsMatchFiniteDifferences) {
  Tensor w = random_f64({6, 3}, 4);
  w.set_requires_grad(true);
  const Tensor indices = Tensor::from_vector<int32_t>({5, 0, 5, 2, 3, 5, 0, 1}, {2, 4});
  testing::expect_gradients_match([&](const std::vector<Tensor>& in) { return embedding(indices, in[0]); }, {w});
}

TEST(Embedding, RejectsIndicesOutsideTheTable) {
  const Tensor w = Tensor::zeros({5, 2});
  try {
    embedding(Tensor::from_vector<int64_t>({0, 7, 1}, {3}), w);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("index 7"), std::string::npos) << message;
    EXPECT_NE(message.find("V = 5"), std::string::npos) << message;
  }
  EXPECT_THROW(embedding(Tensor::from_vector<int32_t>({-1}, {1}), w), Error);
  EXPECT_THROW(embedding(Tensor::from_vector<int32_t>({5}, {1}), w), Error);
  EXPECT_THROW(embedding(Tensor::zeros({2}), w), Error);  // f32 indices
  EXPECT_THROW(embedding(Tensor::from_vector<int64_t>({0}, {1}), Tensor::zeros({5})), Error);
}

}  // namespace
}  // namespace lockstep
