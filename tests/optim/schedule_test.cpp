// LR schedules: values at known steps worked out by hand, and the parser's syntax and errors.
#include "lockstep/optim/schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "lockstep/core/error.h"

namespace lockstep::optim {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_schedule(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Schedule, ConstantIsTheBaseRate) {
  const Schedule s = parse_schedule("constant");
  EXPECT_EQ(s.kind, Schedule::Kind::constant);
  EXPECT_EQ(s.lr_at(0.3, 0), 0.3);
  EXPECT_EQ(s.lr_at(0.3, 123456), 0.3);
}

TEST(Schedule, StepDecaysEveryStepSize) {
  const Schedule s = parse_schedule("step:30:0.5");
  EXPECT_EQ(s.step_size, 30);
  EXPECT_EQ(s.lr_at(1.0, 0), 1.0);
  EXPECT_EQ(s.lr_at(1.0, 29), 1.0);
  EXPECT_EQ(s.lr_at(1.0, 30), 0.5);
  EXPECT_EQ(s.lr_at(1.0, 59), 0.5);
  EXPECT_EQ(s.lr_at(1.0, 60), 0.25);
  EXPECT_DOUBLE_EQ(parse_schedule("step:10").lr_at(2.0, 25), 2.0 * 0.1 * 0.1);  // gamma defaults to 0.1
}

TEST(Schedule, CosineWarmsUpLinearlyThenDecaysToMinLr) {
  const Schedule s = parse_schedule("cosine:warmup=10,total=110,min_lr=0.1");
  EXPECT_DOUBLE_EQ(s.lr_at(1.0, 0), 0.1);   // (0 + 1) / 10
  EXPECT_DOUBLE_EQ(s.lr_at(1.0, 4), 0.5);   // (4 + 1) / 10
  EXPECT_DOUBLE_EQ(s.lr_at(1.0, 9), 1.0);   // warmup done
  EXPECT_DOUBLE_EQ(s.lr_at(1.0, 10), 1.0);  // cosine at t = 0
  EXPECT_NEAR(s.lr_at(1.0, 35), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 4)), 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(1.0, 60), 0.55);  // halfway: mean of peak and floor
  EXPECT_DOUBLE_EQ(s.lr_at(1.0, 110), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(1.0, 500), 0.1);
}

TEST(Schedule, CosineTotalComesFromTheRunWhenNotGiven) {
  const Schedule s = parse_schedule("cosine:warmup=100");
  EXPECT_EQ(s.total_steps, 0);
  EXPECT_DOUBLE_EQ(s.lr_at(2.0, 49), 1.0);  // warmup needs no total
  EXPECT_THROW(s.lr_at(2.0, 100), Error);
  const Schedule run = s.with_total_steps(300);
  EXPECT_EQ(run.total_steps, 300);
  EXPECT_DOUBLE_EQ(run.lr_at(2.0, 200), 1.0);
  EXPECT_EQ(parse_schedule("cosine:total=50").with_total_steps(300).total_steps, 50);  // given wins
  EXPECT_DOUBLE_EQ(parse_schedule("cosine:total=100").lr_at(1.0, 50), 0.5);            // no warmup
  EXPECT_THROW(s.with_total_steps(100), Error);                                        // warmup fills the run
}

TEST(Schedule, StrRoundTrips) {
  for (const char* text : {"constant", "step:30:0.1", "cosine:warmup=100,total=1000,min_lr=0.001"}) {
    const Schedule s = parse_schedule(text);
    const Schedule again = parse_schedule(s.str());
    EXPECT_EQ(again.kind, s.kind) << text;
    EXPECT_EQ(again.lr_at(1.0, 500), s.lr_at(1.0, 500)) << text;
  }
}

TEST(Schedule, ErrorsNameTheBadText) {
  EXPECT_NE(error_of("linear").find("unknown LR schedule 'linear'"), std::string::npos);
  EXPECT_NE(error_of("step:x:0.1").find("step size 'x'"), std::string::npos);
  EXPECT_NE(error_of("step:0").find("step size '0'"), std::string::npos);
  EXPECT_NE(error_of("step:30:abc").find("gamma 'abc'"), std::string::npos);
  EXPECT_NE(error_of("step").find("step needs a step size"), std::string::npos);
  EXPECT_NE(error_of("step:1:2:3").find("step needs a step size"), std::string::npos);
  EXPECT_NE(error_of("cosine:warm=3").find("unknown cosine option 'warm=3'"), std::string::npos);
  EXPECT_NE(error_of("cosine:warmup=-1").find("warmup '-1'"), std::string::npos);
  EXPECT_NE(error_of("cosine:warmup=10,total=10").find("must exceed warmup"), std::string::npos);
  EXPECT_NE(error_of("constant:3").find("constant takes no options"), std::string::npos);
  EXPECT_NE(error_of("linear").find("step:30:0.1"), std::string::npos);  // shows the syntax
}

}  // namespace
}  // namespace lockstep::optim
