#include "lockstep/ops/random.h"

#include <gtest/gtest.h>

#include <cmath>

#include "lockstep/ops/shape_ops.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

TEST(Random, UniformFillsInElementOrder) {
  const Tensor t = Tensor::empty({3, 5}, DType::f64);
  Philox rng(11, 1);
  uniform_(t, -2, 3, rng);
  Philox reference(11, 1);
  const auto values = t.to_vector<double>();
  // Within 4 ulp: the library never fuses low + span * u into one FMA (ops/random.cpp compiles
  // with -ffp-contract=off), but the compiler may fuse it in this file.
  for (double v : values) EXPECT_DOUBLE_EQ(v, -2 + 5 * reference.next_double());
  EXPECT_EQ(rng.counter(), reference.counter());
  // f32 gets the same draws, rounded.
  const Tensor f = Tensor::empty({3, 5});
  Philox rng32(11, 1);
  uniform_(f, -2, 3, rng32);
  const auto floats = f.to_vector<float>();
  for (size_t i = 0; i < floats.size(); ++i) EXPECT_EQ(floats[i], static_cast<float>(values[i]));
}

TEST(Random, UniformStaysInRangeWithTheRightMean) {
  const Tensor t = Tensor::empty({20000});
  Philox rng(3, 1);
  uniform_(t, 0.5, 1.5, rng);
  double total = 0;
  for (float v : t.to_vector<float>()) {
    EXPECT_GE(v, 0.5f);
    EXPECT_LT(v, 1.5f);
    total += v;
  }
  EXPECT_NEAR(total / 20000, 1.0, 0.01);  // sd of the mean is 0.002
}

TEST(Random, NormalHasTheRightMomentsAndOrder) {
  const Tensor t = Tensor::empty({20000}, DType::f64);
  Philox rng(5, 1);
  normal_(t, 2.0, 0.5, rng);
  const auto v = t.to_vector<double>();
  double mean = 0, var = 0;
  for (double x : v) mean += x / static_cast<double>(v.size());
  for (double x : v) var += (x - mean) * (x - mean) / static_cast<double>(v.size());
  EXPECT_NEAR(mean, 2.0, 0.015);
  EXPECT_NEAR(std::sqrt(var), 0.5, 0.015);
  Philox reference(5, 1);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(v[i], 2.0 + 0.5 * reference.next_normal());
}

TEST(Random, StridedViewsFillInTheirOwnElementOrder) {
  const Tensor base = Tensor::zeros({2, 3}, DType::f64);
  const Tensor view = transpose(base, 0, 1);  // [3, 2]
  Philox rng(9, 1);
  uniform_(view, 0, 1, rng);
  Philox reference(9, 1);
  for (double v : view.to_vector<double>()) EXPECT_EQ(v, reference.next_double());
}

TEST(Random, RejectsBadArguments) {
  Philox rng(1, 1);
  EXPECT_THROW(uniform_(Tensor::empty({2}), 1, 1, rng), Error);
  EXPECT_THROW(uniform_(Tensor::empty({2}, DType::i32), 0, 1, rng), Error);
  EXPECT_THROW(normal_(Tensor::empty({2}), 0, -1, rng), Error);
}

}  // namespace
}  // namespace lockstep
