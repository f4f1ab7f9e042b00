// Products under autocast on every device: they read their operands rounded to bf16 or f16
// (on CPU devices the bits of f32 products of the rounded values, from the gradients too), and
// linear and matmul keep an activation operand for backward in that type — half its bytes —
// unless another op keeps it anyway. A GPT keeps less under bf16 and learns as under f32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "lockstep/core/allocator.h"
#include "lockstep/core/autocast.h"
#include "lockstep/nn/gpt.h"
#include "lockstep/ops/ops.h"
#include "testing/devices.h"

namespace lockstep {
namespace {

Tensor random_matrix(int64_t rows, int64_t cols, uint32_t seed, Device device) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) v = dist(gen);
  return Tensor::from_vector(values, {rows, cols}).to(device);
}

Tensor rounded(const Tensor& t, DType type) { return t.to(type).to(DType::f32); }

// CPU devices multiply the rounded values in f32, so a product equals the plain product of
// the rounded operands bit for bit; a GPU's tensor cores sum in another order than its f32
// kernels, so there within f32 rounding of the sum.
void expect_product(const Tensor& got, const Tensor& expected, Device device, const std::string& what) {
  const std::vector<float> g = got.to_vector<float>(), e = expected.to_vector<float>();
  ASSERT_EQ(g.size(), e.size()) << what;
  if (device.is_cpu()) {
    EXPECT_EQ(std::memcmp(g.data(), e.data(), g.size() * sizeof(float)), 0) << what << ": not the same bits";
    return;
  }
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], e[i], 1e-4 * (1 + std::fabs(e[i]))) << what << " [" << i << "]";
}

class AutocastProducts : public testing::DeviceTest {};

TEST_P(AutocastProducts, ForwardAndGradientsReadTheRoundedOperands) {
  const Device device = GetParam();
  for (const DType type : {DType::bf16, DType::f16}) {
    const Tensor x_leaf = random_matrix(24, 64, 1, device).set_requires_grad(true);
    const Tensor w = random_matrix(40, 64, 2, device).set_requires_grad(true);
    const Tensor b = random_matrix(1, 40, 3, device).reshape({40});
    const Tensor upstream = random_matrix(24, 40, 4, device);
    Tensor y;
    {
      const AutocastGuard autocast(type);
      y = linear(mul(x_leaf, 1.0), w, b);  // x a product of the graph, as activations are
      y.backward(upstream);
    }
    const std::string name = dtype_name(type);
    expect_product(y, linear(rounded(x_leaf.detach(), type), rounded(w.detach(), type), b), device, name + " y");
    expect_product(w.grad(), matmul(transpose(rounded(upstream, type), 0, 1), rounded(x_leaf.detach(), type)), device,
                   name + " dw");
    expect_product(x_leaf.grad(), matmul(rounded(upstream, type), rounded(w.detach(), type)), device, name + " dx");
    // A batched product of two activations, as attention's.
    const Tensor q_leaf = random_matrix(3 * 8, 16, 5, device).reshape({3, 8, 16}).set_requires_grad(true);
    const Tensor k_leaf = random_matrix(3 * 16, 8, 6, device).reshape({3, 16, 8}).set_requires_grad(true);
    const Tensor scores_grad = random_matrix(3 * 8, 8, 7, device).reshape({3, 8, 8});
    Tensor scores;
    {
      const AutocastGuard autocast(type);
      scores = matmul(mul(q_leaf, 1.0), mul(k_leaf, 1.0));
      scores.backward(scores_grad);
    }
    const Tensor q = rounded(q_leaf.detach(), type), k = rounded(k_leaf.detach(), type), g = rounded(scores_grad, type);
    expect_product(scores, matmul(q, k), device, name + " scores");
    expect_product(q_leaf.grad(), matmul(g, transpose(k, 1, 2)), device, name + " dq");
    expect_product(k_leaf.grad(), matmul(transpose(q, 1, 2), g), device, name + " dk");
  }
}

// Bytes held by live tensors on the device after `forward` has returned what it made.
template <typename Forward>
int64_t kept_after(Device device, DType type, const Forward& forward) {
  const int64_t before = memory_stats(device).allocated_bytes;
  const AutocastGuard autocast(type);
  const Tensor out = forward();
  return memory_stats(device).allocated_bytes - before;
}

TEST_P(AutocastProducts, LinearKeepsItsActivationRoundedUnlessAnotherOpKeepsIt) {
  const Device device = GetParam();
  const int64_t n = 64, in = 128, hidden = 256, out = 32;  // sizes the GPU's allocator does not round
  const Tensor x = random_matrix(n, in, 8, device);
  const Tensor w1 = random_matrix(hidden, in, 9, device).set_requires_grad(true);
  const Tensor w2 = random_matrix(out, hidden, 10, device).set_requires_grad(true);
  // gelu keeps its input: its output is the second product's alone, kept as bf16 (2 bytes an
  // element instead of 4) once the f32 output goes at the end of the expression.
  const auto through_gelu = [&] { return linear(gelu(linear(x, w1)), w2); };
  const int64_t f32 = kept_after(device, DType::f32, through_gelu),
                bf16 = kept_after(device, DType::bf16, through_gelu);
  EXPECT_EQ(f32 - bf16, n * hidden * 2) << "f32 kept " << f32 << " bytes, bf16 " << bf16;
  // relu keeps its output for backward: the product reads the same f32 bytes, no copy beside.
  const auto through_relu = [&] { return linear(relu(linear(x, w1)), w2); };
  EXPECT_EQ(kept_after(device, DType::bf16, through_relu), kept_after(device, DType::f32, through_relu));
  // Outside the graph nothing is kept, and nothing is rounded ahead.
  const NoGradGuard no_grad;
  EXPECT_EQ(kept_after(device, DType::bf16, through_gelu), n * out * 4);
}

// A GPT's forward keeps its blocks' product inputs (the layer norms' outputs, attention's q,
// k, v and output, the MLP's gelu) in bf16; the loss stays near f32's.
TEST_P(AutocastProducts, AGptKeepsLessUnderBf16AndLearnsAsUnderF32) {
  const Device device = GetParam();
  const nn::GptConfig config{.vocab = 256, .context = 32, .layers = 2, .heads = 2, .width = 64};
  nn::Gpt model(config, 3);
  model.to(device);
  std::vector<int64_t> tokens(4 * 32), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i * 37 % 256), targets[i] = tokens[i] ^ 1;
  const Tensor t = Tensor::from_vector(tokens, {4, 32}).to(device),
               y = Tensor::from_vector(targets, {4, 32}).to(device);
  std::vector<double> losses;
  std::vector<int64_t> kept;
  for (const DType type : {DType::f32, DType::bf16}) {
    model.zero_grad();
    const int64_t before = memory_stats(device).allocated_bytes;
    const AutocastGuard autocast(type);
    const Tensor loss = nn::gpt_loss(model.forward(t), y);
    kept.push_back(memory_stats(device).allocated_bytes - before);
    losses.push_back(loss.item());
    loss.backward();
  }
  EXPECT_LT(static_cast<double>(kept[1]), 0.85 * static_cast<double>(kept[0]))
      << "f32 kept " << kept[0] << " bytes after forward, bf16 " << kept[1];
  EXPECT_NEAR(losses[1], losses[0], 1e-2 * losses[0]);
}

INSTANTIATE_TEST_SUITE_P(Devices, AutocastProducts, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep
