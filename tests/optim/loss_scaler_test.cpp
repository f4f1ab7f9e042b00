#include "lockstep/optim/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "testing/devices.h"

namespace lockstep::optim {
namespace {

class LossScalerTest : public lockstep::testing::DeviceTest {};

TEST_P(LossScalerTest, UnscalesExactlyAndFindsInfAndNan) {
  const LossScaler scaler({.init_scale = 1024.0});
  const std::vector<float> values = {3.0f, -1e-30f, 0.0f, -0.0f, 1e30f, 7.25f};
  const Tensor a = Tensor::from_vector(values, {2, 3}, GetParam());
  const Tensor b = Tensor::from_vector(std::vector<double>{1024.0, 1.0 / 3.0}, {2}, GetParam()).to(DType::f64);
  EXPECT_TRUE(scaler.unscale({a, Tensor(), b}));
  const std::vector<float> out = a.to_vector<float>();
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(out[i], values[i] / 1024.0f) << i;  // bit for bit: dividing by 2^10 is exact
    EXPECT_EQ(std::signbit(out[i]), std::signbit(values[i])) << i;
  }
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>{1.0, 1.0 / 3.0 / 1024.0}));
  for (const float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()}) {
    const Tensor g = Tensor::from_vector(std::vector<float>{1.0f, bad, 2.0f}, {3}, GetParam());
    EXPECT_FALSE(scaler.unscale({Tensor::ones({4}, DType::f32, GetParam()), g})) << bad;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, LossScalerTest, LOCKSTEP_TEST_DEVICES);

TEST(LossScaler, HalvesOnOverflowAndDoublesAfterAStreak) {
  LossScaler scaler({.init_scale = 8.0, .growth_interval = 3});
  scaler.update(true);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 8.0);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 16.0);
  scaler.update(true);
  scaler.update(false);  // the streak restarts
  EXPECT_EQ(scaler.scale(), 8.0);
  scaler.update(true);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 8.0);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 16.0);
}

TEST(LossScaler, StateRoundTripsAndContinuesTheStreak) {
  LossScaler first({.init_scale = 4.0, .growth_interval = 4});
  first.update(false);
  first.update(true);
  first.update(true);
  LossScaler second({.init_scale = 65536.0, .growth_interval = 4});
  second.load_state_dict(first.state_dict());
  EXPECT_EQ(second.scale(), 2.0);
  second.update(true);
  EXPECT_EQ(second.scale(), 2.0);
  second.update(true);  // the fourth finite step in a row
  EXPECT_EQ(second.scale(), 4.0);
}

TEST(LossScaler, RejectsScalesThatAreNotPowersOfTwo) {
  EXPECT_THROW(LossScaler({.init_scale = 1000.0}), Error);
  EXPECT_THROW(LossScaler({.init_scale = 0.0}), Error);
  EXPECT_THROW(LossScaler({.init_scale = 2.0, .growth_interval = 0}), Error);
  LossScaler scaler;
  EXPECT_THROW(scaler.load_state_dict({{"loss_scale", Tensor::scalar(3.0, DType::f64)}}), Error);
  EXPECT_THROW(scaler.load_state_dict({}), Error);
}

}  // namespace
}  // namespace lockstep::optim
