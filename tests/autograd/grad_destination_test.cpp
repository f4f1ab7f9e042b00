// Tensor::set_grad_destination: a linear layer computes its weight's gradient straight into
// the given view, with the bits of an ordinary backward; everything else (a bias, a second
// use of the weight in the same pass, a leaf that already has a grad, the pass after) gets
// an ordinary gradient, and a destination that does not fit is refused.
#include <gtest/gtest.h>

#include <vector>

#include "lockstep/ops/ops.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::random_f64;

struct Layer {
  Tensor x = random_f64({6, 5}, 1).to(DType::f32);
  Tensor w = random_f64({4, 5}, 2).to(DType::f32).set_requires_grad(true);
  Tensor b = random_f64({4}, 3).to(DType::f32).set_requires_grad(true);
  void backward(bool twice = false) const {
    Tensor y = linear(x, w, b);
    if (twice) y = add(y, linear(tanh(x), w, b));  // the weight used again, with other inputs
    sum(mul(y, y)).backward();
  }
};

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

TEST(GradDestination, LinearComputesTheWeightGradientInPlaceWithTheSameBits) {
  Layer plain, placed;
  plain.backward();
  const Tensor bucket = Tensor::zeros({3 + 20}, DType::f32);
  const Tensor view = slice(bucket, 0, 3, 23).reshape({4, 5});
  placed.w.set_grad_destination(view);
  placed.backward();
  EXPECT_EQ(placed.w.grad().data_ptr(), view.data_ptr());  // no copy: .grad is the view
  EXPECT_EQ(values(placed.w.grad()), values(plain.w.grad()));
  EXPECT_EQ(values(slice(bucket, 0, 0, 3)), std::vector<float>(3, 0.0f));  // nothing outside it
  EXPECT_EQ(values(placed.b.grad()), values(plain.b.grad()));

  // For one pass only: the next one accumulates into .grad as usual.
  plain.backward();
  placed.backward();
  EXPECT_EQ(values(placed.w.grad()), values(plain.w.grad()));
}

TEST(GradDestination, ASecondUseOfTheWeightInOnePassStillSumsBoth) {
  Layer plain, placed;
  plain.backward(true);
  const Tensor view = Tensor::zeros({4, 5}, DType::f32);
  placed.w.set_grad_destination(view);
  placed.backward(true);
  EXPECT_EQ(values(placed.w.grad()), values(plain.w.grad()));
}

TEST(GradDestination, ALeafThatHasAGradAccumulatesAsUsual) {
  Layer plain, placed;
  plain.backward();
  placed.backward();
  const Tensor view = Tensor::zeros({4, 5}, DType::f32);
  placed.w.set_grad_destination(view);
  plain.backward();
  placed.backward();
  EXPECT_EQ(values(placed.w.grad()), values(plain.w.grad()));
  EXPECT_EQ(values(view), std::vector<float>(20, 0.0f));
}

TEST(GradDestination, ADestinationUnlikeItsLeafIsRefused) {
  const Layer layer;
  try {
    layer.w.set_grad_destination(Tensor::zeros({5, 4}, DType::f32));
    FAIL() << "a [5, 4] destination for a [4, 5] weight was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 5]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(layer.w.set_grad_destination(Tensor::zeros({4, 5}, DType::f64)), std::exception);
  EXPECT_THROW(layer.w.set_grad_destination(transpose(Tensor::zeros({5, 4}, DType::f32), 0, 1)), std::exception);
  EXPECT_THROW(linear(layer.x, layer.w, layer.b).set_grad_destination(Tensor::zeros({6, 4})), std::exception);
}

}  // namespace
}  // namespace lockstep
