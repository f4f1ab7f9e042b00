// The GPT model (nn/gpt.h): against PyTorch on the same weights (logits, loss and every
// gradient, from tests/fixtures/torch_gpt.safetensors, written by make_gpt_fixture.py),
// causality, initialization, errors, generation, and that a few optimizer steps learn.
#include "lockstep/nn/gpt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "lockstep/io/safetensors.h"
#include "lockstep/nn/init.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/adamw.h"
#include "testing/devices.h"
#include "testing/errors.h"
#include "testing/torch_match.h"

namespace lockstep {
namespace {

using nn::Gpt;
using nn::GptConfig;
using testing::error_of;
using testing::expect_matches;

// The fixture's config (make_gpt_fixture.py's CONFIG).
GptConfig fixture_config() {
  GptConfig c;
  c.vocab = 256, c.context = 16, c.layers = 2, c.heads = 2, c.width = 32;
  return c;
}

// Tokens [rows, cols] from a small linear congruential formula: deterministic, spread over the vocabulary.
Tensor some_tokens(int64_t rows, int64_t cols, int64_t vocab, uint64_t salt = 0) {
  std::vector<int64_t> values(static_cast<size_t>(rows * cols));
  uint64_t state = 12345 + salt;
  for (auto& v : values) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(vocab));
  }
  return Tensor::from_vector(values, {rows, cols});
}

// On each test device: the CPU's kernels and the GPU's (cuBLAS, the row kernels) alike.
class GptTorch : public testing::DeviceTest {};

TEST_P(GptTorch, LogitsLossAndGradientsMatchPytorch) {
  const TensorFile fixture =
      load_safetensors(std::string(LOCKSTEP_SOURCE_DIR) + "/tests/fixtures/torch_gpt.safetensors");
  ASSERT_EQ(fixture.metadata.at("config"), "vocab=256,context=16,layers=2,heads=2,width=32");
  Gpt model(fixture_config());
  model.to(GetParam());

  // Same names in the same order as PyTorch's named_parameters(): weights load unchanged.
  std::string names;
  NamedTensors weights;
  for (const auto& [name, t] : model.named_parameters()) {
    if (!names.empty()) names += ",";
    names += name;
    weights.emplace_back(name, fixture.at("param." + name));
  }
  ASSERT_EQ(names, fixture.metadata.at("parameters"));
  model.load_state_dict(weights);

  const Tensor logits = model.forward(fixture.at("tokens").to(GetParam()));
  const Tensor loss = nn::gpt_loss(logits, fixture.at("targets").to(GetParam()));
  loss.backward();
  EXPECT_EQ(logits.device(), GetParam());
  expect_matches(logits, fixture.at("logits"), "logits");
  expect_matches(loss, fixture.at("loss"), "loss");
  for (const auto& [name, t] : model.named_parameters())
    expect_matches(t.grad(), fixture.at("grad." + name), "grad." + name);
}

INSTANTIATE_TEST_SUITE_P(Devices, GptTorch, LOCKSTEP_TEST_DEVICES);

TEST(GptModel, ParameterNamesShapesAndCount) {
  const GptConfig c = fixture_config();
  Gpt model(c);
  const NamedTensors params = model.named_parameters();
  ASSERT_EQ(params.size(), 2 + 12 * static_cast<size_t>(c.layers) + 2);  // no lm_head: tied to wte
  EXPECT_EQ(params.front().first, "wte.weight");
  EXPECT_EQ(params.front().second.shape(), (Shape{256, 32}));
  EXPECT_EQ(params[1].first, "wpe.weight");
  EXPECT_EQ(params[1].second.shape(), (Shape{16, 32}));
  EXPECT_EQ(params[4].first, "h.0.attn.c_attn.weight");
  EXPECT_EQ(params[4].second.shape(), (Shape{96, 32}));
  EXPECT_EQ(params.back().first, "ln_f.bias");
  // vocab*w + context*w + layers * (4 layer-norm vectors + qkv + proj + fc + proj) + ln_f.
  const int64_t w = c.width;
  const int64_t per_block = 4 * w + (3 * w * w + 3 * w) + (w * w + w) + (4 * w * w + 4 * w) + (4 * w * w + w);
  EXPECT_EQ(model.num_parameters(), c.vocab * w + c.context * w + c.layers * per_block + 2 * w);
  // The planner's count, computed without building, is the built model's.
  EXPECT_EQ(nn::gpt_parameter_count(c), static_cast<double>(model.num_parameters()));
  // GPT-2 small with its own vocabulary: 124,439,808 parameters, the head tied to wte, as
  // Hugging Face's GPT2LMHeadModel counts them (building it here would take seconds).
  nn::GptConfig gpt2 = nn::gpt_preset("gpt2-124m");
  gpt2.vocab = 50257;
  EXPECT_EQ(nn::gpt_parameter_count(gpt2), 124439808.0);
}

TEST(GptModel, LaterTokensLeaveEarlierLogitsBitIdentical) {
  Gpt model(fixture_config(), 3);
  const Tensor tokens = some_tokens(2, 16, 256);
  const Tensor changed = tokens.clone();
  changed.data<int64_t>()[10] = (changed.data<int64_t>()[10] + 1) % 256;  // row 0, position 10
  const auto a = model.forward(tokens).to_vector<float>(), b = model.forward(changed).to_vector<float>();
  const size_t per_position = 256;
  for (size_t pos = 0; pos < 16; ++pos) {
    const bool same = std::equal(a.begin() + pos * per_position, a.begin() + (pos + 1) * per_position,
                                 b.begin() + pos * per_position);
    if (pos < 10) {
      EXPECT_TRUE(same) << "position " << pos << " saw the change at position 10";
    } else {
      EXPECT_FALSE(same) << "position " << pos << " did not see the change at position 10";
    }
  }
  // Row 1 was not changed at all.
  EXPECT_TRUE(std::equal(a.begin() + 16 * per_position, a.end(), b.begin() + 16 * per_position));
}

TEST(GptModel, ShorterSequencesAndI32TokensWork) {
  Gpt model(fixture_config(), 3);
  const Tensor tokens = some_tokens(1, 16, 256);
  const auto full = model.forward(tokens).to_vector<float>();
  const auto head = model.forward(slice(tokens, 1, 0, 5).contiguous()).to_vector<float>();
  ASSERT_EQ(head.size(), 5u * 256u);
  // Same values as the first five positions of the full sequence (up to BLAS blocking).
  for (size_t k = 0; k < head.size(); ++k) EXPECT_NEAR(head[k], full[k], 1e-5) << k;
  const auto as_i32 = model.forward(tokens.to(DType::i32)).to_vector<float>();
  EXPECT_EQ(as_i32, full);
}

TEST(GptInit, SameSeedSameBitsAndGpt2Statistics) {
  GptConfig c;
  c.context = 64, c.layers = 4, c.heads = 2, c.width = 64;
  Gpt a(c, 7), b(c, 7), other(c, 8);
  const NamedTensors pa = a.named_parameters(), pb = b.named_parameters(), po = other.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].second.to_vector<float>(), pb[i].second.to_vector<float>()) << pa[i].first;
  }
  EXPECT_NE(pa[0].second.to_vector<float>(), po[0].second.to_vector<float>());
  // Re-initializing through nn::initialize gives the constructor's values: one seed, one model.
  nn::initialize(other, 7);
  EXPECT_EQ(other.named_parameters()[5].second.to_vector<float>(), pa[5].second.to_vector<float>());

  auto stddev = [](const Tensor& t) {
    const auto v = t.to_vector<double>();
    double s = 0, s2 = 0;
    for (const double x : v) s += x, s2 += x * x;
    const double m = s / static_cast<double>(v.size());
    return std::sqrt(s2 / static_cast<double>(v.size()) - m * m);
  };
  const double residual = 0.02 / std::sqrt(2.0 * 4);
  for (const auto& [name, t] : pa) {
    const auto v = t.to_vector<float>();
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (name.find("ln_") != std::string::npos) {
      const float want = is_bias ? 0.0f : 1.0f;
      EXPECT_TRUE(std::all_of(v.begin(), v.end(), [&](float x) { return x == want; })) << name;
    } else if (is_bias) {
      EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; })) << name;
    } else {
      const double want = name.find("c_proj") != std::string::npos ? residual : 0.02;
      EXPECT_NEAR(stddev(t), want, 0.05 * want) << name;  // >= 4096 draws: ~1% sampling error
    }
  }
  // A layer alone comes out of its constructor with GPT-2's init, not PyTorch's default.
  nn::GptLinear alone(64, 64, 0.02);
  EXPECT_NEAR(stddev(alone.weight), 0.02, 0.001);
  EXPECT_EQ(alone.bias.to_vector<float>(), std::vector<float>(64, 0.0f));
}

TEST(GptErrors, ConfigsPresetsAndLongSequences) {
  const GptConfig tiny = nn::gpt_preset("tiny");
  EXPECT_EQ(tiny.vocab, 256);
  const GptConfig big = nn::gpt_preset("gpt2-124m");
  EXPECT_EQ(big.layers, 12);
  EXPECT_EQ(big.heads, 12);
  EXPECT_EQ(big.width, 768);
  EXPECT_EQ(big.context, 1024);
  EXPECT_NO_THROW(nn::gpt_preset("small"));
  const std::string unknown = error_of([] { nn::gpt_preset("huge"); });
  EXPECT_NE(unknown.find("'huge'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("tiny, small, gpt2-124m"), std::string::npos) << unknown;

  GptConfig odd = fixture_config();
  odd.width = 30, odd.heads = 4;
  const std::string heads = error_of([&] { Gpt model(odd); });
  EXPECT_NE(heads.find("width 30 is not divisible by heads 4"), std::string::npos) << heads;
  GptConfig zero = fixture_config();
  zero.layers = 0;
  EXPECT_NE(error_of([&] { Gpt model(zero); }).find("layers 0"), std::string::npos);

  Gpt model(fixture_config());
  const std::string too_long = error_of([&] { model.forward(some_tokens(1, 17, 256)); });
  EXPECT_NE(too_long.find("sequence length 17 exceeds the model's context 16"), std::string::npos) << too_long;
  const std::string flat = error_of([&] { model.forward(Tensor::from_vector<int64_t>({1, 2}, {2})); });
  EXPECT_NE(flat.find("[batch, time]"), std::string::npos) << flat;
}

// Greedy decoding done by hand: the argmax of the last position, feeding the last `context` tokens.
std::vector<int64_t> greedy_by_hand(Gpt& model, std::vector<int64_t> sequence, int64_t count) {
  std::vector<int64_t> out;
  for (int64_t n = 0; n < count; ++n) {
    const int64_t window = std::min<int64_t>(static_cast<int64_t>(sequence.size()), model.config.context);
    const std::vector<int64_t> fed(sequence.end() - window, sequence.end());
    const Tensor logits = model.forward(Tensor::from_vector(fed, {1, window}));
    const Tensor last = slice(logits, 1, window - 1, window);
    const int64_t next = static_cast<int64_t>(argmax(reshape(last, {-1}), 0).item());
    sequence.push_back(next);
    out.push_back(next);
  }
  return out;
}

TEST(GptGenerate, GreedyEqualsArgmaxByHandAndTheWindowSlides) {
  Gpt model(fixture_config(), 5);
  const std::vector<int64_t> prompt = {72, 101, 108, 108, 111};
  // 20 new tokens after 5: the sequence passes the context of 16, so the window slides.
  const auto greedy = nn::generate(model, prompt, 20, 0.0, 1);
  ASSERT_EQ(greedy.size(), 20u);
  EXPECT_EQ(greedy, nn::generate(model, prompt, 20, 0.0, 99)) << "greedy must not depend on the seed";
  EXPECT_EQ(greedy, greedy_by_hand(model, prompt, 20));
  for (const int64_t t : greedy) EXPECT_TRUE(t >= 0 && t < 256) << t;
}

TEST(GptGenerate, SamplingIsReproduciblePerSeedAndPosition) {
  Gpt model(fixture_config(), 5);
  const std::vector<int64_t> prompt = {10, 20, 30};
  const auto a = nn::generate(model, prompt, 24, 1.0, 42);
  EXPECT_EQ(a, nn::generate(model, prompt, 24, 1.0, 42));
  EXPECT_NE(a, nn::generate(model, prompt, 24, 1.0, 43));
  // Keyed by position: a shorter run is a prefix of a longer one.
  const auto shorter = nn::generate(model, prompt, 8, 1.0, 42);
  EXPECT_TRUE(std::equal(shorter.begin(), shorter.end(), a.begin()));
  // A near-zero temperature is the greedy choice.
  EXPECT_EQ(nn::generate(model, prompt, 8, 1e-6, 42), nn::generate(model, prompt, 8, 0.0, 42));
  EXPECT_NE(error_of([&] { nn::generate(model, {}, 1, 1.0, 0); }).find("at least one token"), std::string::npos);
}

TEST(GptGenerate, SampleTokenFollowsTheTemperedSoftmax) {
  // softmax([0, log 3]) = [0.25, 0.75]: u below 0.25 picks 0, above picks 1.
  const std::vector<float> logits = {0.0f, static_cast<float>(std::log(3.0))};
  EXPECT_EQ(nn::sample_token(logits, 1.0, 0.0), 0);
  EXPECT_EQ(nn::sample_token(logits, 1.0, 0.2499), 0);
  EXPECT_EQ(nn::sample_token(logits, 1.0, 0.2501), 1);
  EXPECT_EQ(nn::sample_token(logits, 1.0, 0.9999), 1);
  // Temperature 2: probabilities proportional to [1, sqrt 3], so p0 = 1 / (1 + sqrt 3) = 0.366.
  EXPECT_EQ(nn::sample_token(logits, 2.0, 0.365), 0);
  EXPECT_EQ(nn::sample_token(logits, 2.0, 0.367), 1);
  // A token with zero probability is never picked, even at the top of the range.
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(nn::sample_token({0.0f, 0.0f, -inf}, 1.0, 0.999999), 1);
}

TEST(GptTraining, AdamWLearnsARepeatedSequence) {
  GptConfig c;
  c.context = 8, c.layers = 1, c.heads = 2, c.width = 16;
  Gpt model(c, 11);
  // "abcdabcd..." as [4, 9]: inputs the first 8 of each row, targets the next.
  std::vector<int64_t> text;
  for (int i = 0; i < 4 * 9; ++i) text.push_back('a' + (i % 4));
  const Tensor rows = Tensor::from_vector(text, {4, 9});
  const Tensor inputs = slice(rows, 1, 0, 8).contiguous(), targets = slice(rows, 1, 1, 9).contiguous();
  optim::AdamW adamw(model.parameters(), {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0});
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    adamw.zero_grad();
    const Tensor loss = nn::gpt_loss(model.forward(inputs), targets);
    loss.backward();
    adamw.step();
    (step == 0 ? first : last) = loss.item();
  }
  EXPECT_NEAR(first, std::log(256.0), 0.1) << "a freshly initialized GPT predicts about uniformly";
  EXPECT_LT(last, 0.2 * first) << "loss went from " << first << " to " << last;
}

}  // namespace
}  // namespace lockstep
