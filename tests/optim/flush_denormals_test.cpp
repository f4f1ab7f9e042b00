// The update loops leave no optimizer state subnormal (it would cost a microcode assist per
// operation on x86), and leave the thread's floating-point mode as they found it.
#include "lockstep/optim/flush_denormals.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "lockstep/optim/adamw.h"
#include "lockstep/optim/sgd.h"

namespace lockstep::optim {
namespace {

// A moment just above the smallest normal float: one more decay by 0.9 makes it subnormal.
constexpr float kAboveSmallest = 1.3e-38f;

bool is_subnormal(float x) { return std::fpclassify(x) == FP_SUBNORMAL; }

// What the caller's thread computes after the step: still subnormal, so the mode is restored.
float halve(float x) {
  volatile float v = x;
  return v * 0.5f;
}

// One step with a zero gradient from a first moment (AdamW) or momentum buffer (SGD) of
// kAboveSmallest: the decayed value, which plain arithmetic makes subnormal.
template <typename Opt, typename Options>
float decayed_state(const Options& options, const std::string& slot) {
  Tensor param = Tensor::zeros({4});
  param.set_requires_grad(true);
  Opt optimizer({param}, options);
  NamedTensors state{{"step", Tensor::scalar(1, DType::i64)}, {"state.0." + slot, Tensor::full({4}, kAboveSmallest)}};
  if (slot == "exp_avg") {
    state.emplace_back("state.0.exp_avg_sq", Tensor::full({4}, 1.0f));
    state.emplace_back("state.0.step", Tensor::scalar(1, DType::i64));
  }
  optimizer.load_state_dict(state);
  param.set_grad(Tensor::zeros({4}));
  optimizer.step();
  for (const auto& [key, value] : optimizer.state_dict())
    if (key == "state.0." + slot) return value.template data<float>()[0];
  ADD_FAILURE() << "no " << slot;
  return -1;
}

// No moment is left subnormal: it becomes zero, or, where the decay's own small term is
// what gets flushed (AdamW's m + (g - m)·0.1 when the compiler does not fuse it into one
// multiply-add), it keeps its last normal value.
TEST(FlushDenormals, NoMomentIsLeftSubnormal) {
  ASSERT_TRUE(is_subnormal(kAboveSmallest * 0.9f)) << "the reference itself must be subnormal";
  const float adamw = decayed_state<AdamW>(AdamWOptions{.lr = 1e-3}, "exp_avg");
  EXPECT_TRUE(adamw == 0.0f || adamw == kAboveSmallest) << adamw;
  const float sgd = decayed_state<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9}, "momentum_buffer");
  EXPECT_TRUE(sgd == 0.0f || sgd == kAboveSmallest) << sgd;
  EXPECT_TRUE(is_subnormal(halve(std::numeric_limits<float>::min()))) << "the thread's mode was not restored";
}

TEST(FlushDenormals, TheGuardRestoresTheMode) {
  {
    const FlushDenormals flush;
#if defined(__SSE__) || defined(__x86_64__)
    EXPECT_EQ(halve(std::numeric_limits<float>::min()), 0.0f);
#endif
  }
  EXPECT_TRUE(is_subnormal(halve(std::numeric_limits<float>::min())));
}

}  // namespace
}  // namespace lockstep::optim
