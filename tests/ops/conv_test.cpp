#include "lockstep/ops/conv.h"

#include <gtest/gtest.h>

#include "lockstep/core/parallel.h"
#include "testing/gradcheck.h"
#include "testing/naive_conv.h"

namespace lockstep {
namespace {

using testing::conv_out_size;
using testing::ConvCase;
using testing::expect_all_close;
using testing::expect_gradients_match;
using testing::naive_conv;
using testing::NaiveConv;
using testing::random_f64;

TEST(Conv2d, MatchesNaiveLoopsWithStrideAndPadding) {
  const std::vector<ConvCase> cases = {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1}, {0, 0}},
      {{2, 3, 7, 6}, {4, 3, 3, 3}, {2, 2}, {1, 1}},
      {{1, 2, 5, 8}, {3, 2, 2, 3}, {2, 1}, {1, 0}},
      {{3, 1, 4, 4}, {2, 1, 1, 1}, {1, 1}, {0, 0}},
      {{1, 2, 3, 3}, {2, 2, 3, 3}, {1, 3}, {2, 2}},
      {{1, 2, 3, 3}, {2, 2, 1, 1}, {2, 1}, {1, 1}},  // border windows read only padding
      // Stride 1 without padding copies whole rows in 32-byte blocks: rows of 19 (blocks and
      // an overlapping last one) and of 8 (one f32 block, two f64 blocks).
      {{2, 3, 7, 21}, {4, 3, 3, 3}, {1, 1}, {0, 0}},
      {{1, 2, 5, 10}, {3, 2, 3, 3}, {1, 1}, {0, 0}},
  };
  for (const ConvCase& c : cases) {
    const Tensor x = random_f64(c.x, 1), w = random_f64(c.w, 2), b = random_f64({c.w[0]}, 3);
    const Tensor out = conv2d(x, w, b, c.stride, c.padding);
    EXPECT_EQ(out.shape(), (Shape{c.x[0], c.w[0], conv_out_size(c.x[2], c.w[2], c.stride[0], c.padding[0]),
                                  conv_out_size(c.x[3], c.w[3], c.stride[1], c.padding[1])}));
    expect_all_close(out, naive_conv(x, w, b, Tensor(), c.stride, c.padding).out, 1e-12, 1e-12);
    // f32 without bias.
    const Tensor out32 = conv2d(x.to(DType::f32), w.to(DType::f32), Tensor(), c.stride, c.padding);
    EXPECT_EQ(out32.dtype(), DType::f32);
    expect_all_close(out32, naive_conv(x, w, Tensor(), Tensor(), c.stride, c.padding).out, 1e-5, 1e-5);
  }
}

TEST(Conv2d, NonContiguousInputs) {
  const Tensor base = random_f64({2, 3, 6, 5}, 4);
  const Tensor x = base.as_strided({2, 3, 5, 6}, {90, 30, 1, 5}, 0);  // H and W swapped
  const Tensor w = random_f64({2, 3, 3, 3}, 5);
  expect_all_close(conv2d(x, w, Tensor(), {1, 1}, {1, 1}), naive_conv(x, w, Tensor(), Tensor(), {1, 1}, {1, 1}).out,
                   1e-12, 1e-12);
}

// Large enough that the batch is cut into one-sample chunks (each its own GEMM), more chunks
// than partial weight-gradient slots, so both sums over chunks and over slots are exercised.
TEST(Conv2d, ManyChunksMatchNaiveForwardAndBackward) {
  const Pair stride{1, 1}, padding{1, 1};
  const Tensor x32 = testing::random_f32({10, 16, 22, 22}, 6), w32 = testing::random_f32({2, 16, 3, 3}, 7);
  const Tensor b32 = testing::random_f32({2}, 8);
  Tensor x = x32.clone(), w = w32.clone(), b = b32.clone();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  const Tensor out = conv2d(x, w, b, stride, padding);
  const Tensor dy = testing::random_f32(out.shape(), 9);
  const NaiveConv ref = naive_conv(x32, w32, b32, dy, stride, padding);
  expect_all_close(out, ref.out, 1e-5, 1e-5);
  out.backward(dy);
  expect_all_close(x.grad(), ref.dx, 1e-5, 1e-5);
  expect_all_close(w.grad(), ref.dw, 1e-5, 1e-4);
  expect_all_close(b.grad(), ref.db, 1e-5, 1e-4);
}

TEST(Conv2d, GradientsMatchFiniteDifferences) {
  const std::vector<ConvCase> cases = {
      {{2, 2, 5, 5}, {3, 2, 3, 3}, {1, 1}, {0, 0}},
      {{1, 2, 6, 5}, {2, 2, 3, 3}, {2, 2}, {1, 1}},
      {{2, 1, 5, 4}, {2, 1, 2, 3}, {2, 1}, {1, 2}},
  };
  for (const ConvCase& c : cases) {
    Tensor x = random_f64(c.x, 10), w = random_f64(c.w, 11), b = random_f64({c.w[0]}, 12);
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    expect_gradients_match(
        [&](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], c.stride, c.padding); }, {x, w, b});
  }
}

TEST(Conv2d, SkipsInputGradientWhenInputNeedsNone) {
  const Tensor x = random_f64({2, 1, 6, 6}, 13);
  Tensor w = random_f64({3, 1, 3, 3}, 14);
  w.set_requires_grad(true);
  const Tensor out = conv2d(x, w);
  const Tensor dy = random_f64(out.shape(), 15);
  out.backward(dy);
  EXPECT_FALSE(x.grad().defined());
  expect_all_close(w.grad(), naive_conv(x, w, Tensor(), dy, {1, 1}, {0, 0}).dw, 1e-12, 1e-12);
}

TEST(Conv2d, ResultsDoNotDependOnThreadCount) {
  const int saved = num_threads();
  auto run = [](int threads) {
    set_num_threads(threads);
    Tensor x = testing::random_f32({8, 16, 20, 20}, 16), w = testing::random_f32({12, 16, 3, 3}, 17);
    Tensor b = testing::random_f32({12}, 18);
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    const Tensor out = conv2d(x, w, b, {1, 1}, {1, 1});
    out.backward(testing::random_f32(out.shape(), 19));
    return std::vector<std::vector<float>>{out.to_vector<float>(), x.grad().to_vector<float>(),
                                           w.grad().to_vector<float>(), b.grad().to_vector<float>()};
  };
  const auto one = run(1);
  const auto two = run(2);
  set_num_threads(saved);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i], two[i]) << "result " << i;
}

TEST(Conv2d, RejectsBadShapes) {
  const Tensor x = Tensor::zeros({1, 3, 4, 4}), w = Tensor::zeros({2, 3, 3, 3});
  EXPECT_THROW(conv2d(Tensor::zeros({3, 4, 4}), w), Error);
  EXPECT_THROW(conv2d(x, Tensor::zeros({2, 2, 3, 3})), Error);  // channels differ
  EXPECT_THROW(conv2d(x, w, Tensor::zeros({3})), Error);        // bias size
  EXPECT_THROW(conv2d(x, Tensor::zeros({2, 3, 5, 5})), Error);  // kernel > input
  EXPECT_NO_THROW(conv2d(x, Tensor::zeros({2, 3, 5, 5}), {}, {1, 1}, {1, 1}));
  EXPECT_THROW(conv2d(x, w, Tensor(), {0, 1}), Error);  // stride
  EXPECT_THROW(conv2d(x, w.to(DType::f64)), Error);     // dtypes differ
  try {
    conv2d(x, Tensor::zeros({2, 3, 7, 3}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("larger than the padded input"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep
