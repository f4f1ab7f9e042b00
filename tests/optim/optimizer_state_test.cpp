// Optimizer state_dict: a run that saves, restores into a fresh optimizer and continues is
// bit-identical to one that never stopped; bad state is rejected in one message.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "lockstep/optim/adamw.h"
#include "lockstep/optim/sgd.h"
#include "testing/gradcheck.h"

namespace lockstep::optim {
namespace {

using testing::random_f64;

std::vector<Tensor> make_params(uint64_t seed) {
  std::vector<Tensor> params;
  params.push_back(random_f64({6, 5}, seed).to(DType::f32).set_requires_grad(true));
  params.push_back(random_f64({5}, seed + 1).to(DType::f32).set_requires_grad(true));
  params.push_back(random_f64({3}, seed + 2).to(DType::f32).set_requires_grad(true));  // never has a grad
  return params;
}

void set_grads(const std::vector<Tensor>& params, uint64_t step) {
  for (size_t i = 0; i + 1 < params.size(); ++i)
    params[i].set_grad(random_f64(params[i].shape(), 1000 + 10 * step + i).to(DType::f32));
}

std::vector<Tensor> clone_values(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) out.push_back(p.detach().clone().set_requires_grad(true));
  return out;
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

template <typename Opt, typename Options>
void expect_resume_is_bit_identical(const Options& options) {
  std::vector<Tensor> params = make_params(1);
  Opt original(params, options);
  for (uint64_t s = 0; s < 3; ++s) {
    set_grads(params, s);
    original.step();
  }
  // Snapshot the weights and the state (a checkpoint), restore into a fresh optimizer.
  std::vector<Tensor> resumed_params = clone_values(params);
  NamedTensors saved;
  for (const auto& [name, t] : original.state_dict()) saved.emplace_back(name, t.clone());
  Opt resumed(resumed_params, options);
  resumed.load_state_dict(saved);
  EXPECT_EQ(resumed.step_count(), 3);
  for (uint64_t s = 3; s < 6; ++s) {
    set_grads(params, s);
    set_grads(resumed_params, s);
    original.step();
    resumed.step();
  }
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(bit_equal(params[i], resumed_params[i])) << "param " << i;
  const NamedTensors a = original.state_dict(), b = resumed.state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(bit_equal(a[i].second, b[i].second)) << a[i].first;
  }
}

TEST(OptimizerState, SGDResumeIsBitIdentical) {
  expect_resume_is_bit_identical<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
}

TEST(OptimizerState, AdamWResumeIsBitIdentical) { expect_resume_is_bit_identical<AdamW>(AdamWOptions{.lr = 0.01}); }

TEST(OptimizerState, NamesFollowPyTorchStateKeys) {
  std::vector<Tensor> params = make_params(1);
  AdamW adamw(params, {});
  set_grads(params, 0);
  adamw.step();
  std::vector<std::string> names;
  for (const auto& entry : adamw.state_dict()) names.push_back(entry.first);
  EXPECT_EQ(names, (std::vector<std::string>{"step", "state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq",
                                             "state.1.step", "state.1.exp_avg", "state.1.exp_avg_sq"}));
  SGD sgd(params, {.lr = 0.1, .momentum = 0.5});
  sgd.step();
  names.clear();
  for (const auto& entry : sgd.state_dict()) names.push_back(entry.first);
  EXPECT_EQ(names, (std::vector<std::string>{"step", "state.0.momentum_buffer", "state.1.momentum_buffer"}));
}

TEST(OptimizerState, LoadReportsEveryProblemAndChangesNothing) {
  std::vector<Tensor> params = make_params(1);
  SGD sgd(params, {.lr = 0.1, .momentum = 0.9});
  set_grads(params, 0);
  sgd.step();
  const NamedTensors bad{{"state.0.momentum_buffer", Tensor::zeros({5, 6})},
                         {"state.7.momentum_buffer", Tensor::zeros({5})},
                         {"state.1.exp_avg", Tensor::zeros({5})},
                         {"bogus", Tensor::zeros({1})}};
  try {
    sgd.load_state_dict(bad);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("state.0.momentum_buffer: shape [5, 6] does not match [6, 5]"), std::string::npos)
        << message;
    EXPECT_NE(message.find("parameter 7 does not exist"), std::string::npos) << message;
    EXPECT_NE(message.find("no state named 'exp_avg'"), std::string::npos) << message;
    EXPECT_NE(message.find("\"bogus\""), std::string::npos) << message;
    EXPECT_NE(message.find("missing key \"step\""), std::string::npos) << message;
  }
  EXPECT_EQ(sgd.step_count(), 1);
  EXPECT_TRUE(sgd.state(0, 0).defined());
}

}  // namespace
}  // namespace lockstep::optim
