#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lockstep/autograd/node.h"
#include "lockstep/ops/linalg.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::random_f64;

// sum(a @ b) written out by hand: d/da[i][k] = sum_j b[k][j].
TEST(Autograd, MatmulGradientMatchesClosedForm) {
  const Tensor a = random_f64({2, 3}, 1).set_requires_grad(true);
  const Tensor b = random_f64({3, 4}, 2).set_requires_grad(true);
  const Tensor c = matmul(a, b);
  c.backward(Tensor::ones({2, 4}, DType::f64));
  const auto bv = b.to_vector<double>(), av = a.to_vector<double>();
  const auto ga = a.grad().to_vector<double>(), gb = b.grad().to_vector<double>();
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 3; ++k) {
      double expected = 0;
      for (int j = 0; j < 4; ++j) expected += bv[k * 4 + j];
      EXPECT_NEAR(ga[i * 3 + k], expected, 1e-12);
    }
  for (int k = 0; k < 3; ++k)
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(gb[k * 4 + j], av[k] + av[3 + k], 1e-12);
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  const Tensor a = random_f64({2, 2}, 3).set_requires_grad(true);
  const Tensor b = random_f64({2, 2}, 4);
  const Tensor seed = Tensor::ones({2, 2}, DType::f64);
  matmul(a, b).backward(seed);
  const auto once = a.grad().to_vector<double>();
  matmul(a, b).backward(seed);
  const auto twice = a.grad().to_vector<double>();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_DOUBLE_EQ(twice[i], 2 * once[i]);
  EXPECT_FALSE(b.grad().defined());  // b does not require grad
}

// A tensor used twice (a diamond in the graph) receives the sum of both paths.
TEST(Autograd, SharedInputSumsBothPaths) {
  const Tensor a = random_f64({3, 3}, 5).set_requires_grad(true);
  testing::expect_gradients_match([](const std::vector<Tensor>& in) { return matmul(matmul(in[0], in[0]), in[0]); },
                                  {a});
}

TEST(Autograd, LinearGradientsMatchFiniteDifferences) {
  const Tensor x = random_f64({4, 3}, 6).set_requires_grad(true);
  const Tensor w = random_f64({5, 3}, 7).set_requires_grad(true);
  const Tensor b = random_f64({5}, 8).set_requires_grad(true);
  testing::expect_gradients_match([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, {x, w, b});
}

TEST(Autograd, BatchedMatmulWithSharedMatrix) {
  const Tensor a = random_f64({2, 3, 4}, 9).set_requires_grad(true);
  const Tensor b = random_f64({4, 2}, 10).set_requires_grad(true);
  testing::expect_gradients_match([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {a, b});
}

TEST(Autograd, TransposedViewsGoToBlasWithoutCopy) {
  const Tensor a = random_f64({3, 2}, 11);
  const Tensor at = a.as_strided({2, 3}, {1, 2}, 0).set_requires_grad(true);
  const Tensor b = random_f64({3, 2}, 12).set_requires_grad(true);
  testing::expect_gradients_match([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {at, b});
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  const Tensor a = random_f64({2, 2}, 13).set_requires_grad(true);
  Tensor c;
  {
    NoGradGuard guard;
    c = matmul(a, a);
  }
  EXPECT_FALSE(c.requires_grad());
  EXPECT_THROW(c.backward(Tensor::ones({2, 2}, DType::f64)), Error);
  EXPECT_TRUE(matmul(a, a).requires_grad());
}

TEST(Autograd, ClearErrors) {
  const Tensor a = random_f64({2, 2}, 14).set_requires_grad(true);
  const Tensor c = matmul(a, a);
  // Not a scalar and no gradient given.
  EXPECT_THROW(c.backward(), Error);
  c.backward(Tensor::ones({2, 2}, DType::f64));
  // The graph's saved tensors are freed after the first backward.
  try {
    c.backward(Tensor::ones({2, 2}, DType::f64));
    FAIL() << "second backward should throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("second time"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tensor::zeros({2}, DType::i64).set_requires_grad(true), Error);
}

TEST(Autograd, DetachCutsHistory) {
  const Tensor a = random_f64({2, 2}, 15).set_requires_grad(true);
  const Tensor d = matmul(a, a).detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
}

// The hook runs once per backward, after every contribution (a used twice) is in grad, and
// in the order backward reaches the leaves: b (nearer the loss) before a.
TEST(Autograd, PostAccumulateGradHookSeesTheFinalGradientOnce) {
  const Tensor a = random_f64({2, 2}, 16).set_requires_grad(true);
  const Tensor b = random_f64({2, 2}, 17).set_requires_grad(true);
  std::vector<std::string> calls;
  std::vector<double> a_grad_seen;
  a.set_post_accumulate_grad_hook([&] {
    calls.push_back("a");
    a_grad_seen = a.grad().to_vector<double>();
  });
  b.set_post_accumulate_grad_hook([&] { calls.push_back("b"); });
  const Tensor c = matmul(matmul(a, a), b);  // a feeds two inputs of the first product
  c.backward(Tensor::ones({2, 2}, DType::f64));
  EXPECT_EQ(calls, (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(a_grad_seen, a.grad().to_vector<double>());
  a.set_post_accumulate_grad_hook(nullptr);
  matmul(a, b).backward(Tensor::ones({2, 2}, DType::f64));
  EXPECT_EQ(calls.size(), 3u);  // only b's hook is left
  EXPECT_THROW(matmul(a, b).set_post_accumulate_grad_hook([] {}), Error);
}

}  // namespace
}  // namespace lockstep
