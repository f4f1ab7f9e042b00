#include "lockstep/nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "lockstep/autograd/checkpoint.h"
#include "lockstep/autograd/grad_mode.h"
#include "lockstep/core/philox.h"
#include "lockstep/nn/init.h"
#include "lockstep/ops/ops.h"

namespace lockstep::nn {
namespace {

// GPT-2's standard deviation for every weight but the residual projections'.
constexpr double kInitStddev = 0.02;

// [T, T] additive mask: 0 where key position j <= query position i, -inf above the diagonal,
// so softmax gives those keys exactly zero weight (and later tokens cannot touch earlier
// positions' results at all, not even by rounding). Made on `device`, where the scores are.
Tensor host_causal_mask(int64_t t, Device device) {
  Tensor mask = Tensor::zeros({t, t});
  float* m = mask.data<float>();
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = i + 1; j < t; ++j) m[i * t + j] = -std::numeric_limits<float>::infinity();
  }
  return mask.to(device);
}

// On a GPU the host-built mask is copied once and kept (one per device, for the last T):
// a copy from the host waits for the device's stream to drain, and every attention layer of
// every forward asks for the mask. Nothing writes into it (it only feeds an addition), so
// sharing it is safe.
Tensor causal_mask(int64_t t, Device device) {
  if (!device.is_cuda()) return host_causal_mask(t, device);
  static std::mutex mutex;
  // Never destroyed: its GPU memory must not be released after the CUDA runtime has shut
  // down at exit.
  static auto* const masks = new std::unordered_map<Device, Tensor>();
  std::lock_guard<std::mutex> lock(mutex);
  Tensor& mask = (*masks)[device];
  if (!mask.defined() || mask.size(0) != t) mask = host_causal_mask(t, device);
  return mask;
}

// GPT-2 scales the projections that write into the residual stream by 1/sqrt(2 * layers)
// (two per block), so the stream's variance does not grow with depth.
double residual_stddev(const GptConfig& config) {
  return kInitStddev / std::sqrt(2.0 * static_cast<double>(config.layers));
}

// The container of the blocks, so they are named h.<i> as in GPT-2's ModuleList.
class BlockList : public Module {
 public:
  BlockList() : Module("ModuleList") {}
};

}  // namespace

std::vector<std::string> gpt_preset_names() { return {"tiny", "small", "gpt2-124m"}; }

GptConfig gpt_preset(const std::string& name) {
  GptConfig config;  // vocab 256 in every preset: byte tokens
  if (name == "tiny") {
    config.context = 64, config.layers = 2, config.heads = 2, config.width = 64;
  } else if (name == "small") {
    config.context = 128, config.layers = 4, config.heads = 4, config.width = 128;
  } else if (name == "gpt2-124m") {
    config.context = 1024, config.layers = 12, config.heads = 12, config.width = 768;
  } else {
    std::string choices;
    for (const auto& known : gpt_preset_names()) {
      if (!choices.empty()) choices += ", ";
      choices += known;
    }
    LOCKSTEP_FAIL() << "unknown GPT preset '" << name << "': choose one of " << choices;
  }
  return config;
}

void check_gpt_config(const GptConfig& c) {
  LOCKSTEP_CHECK(c.vocab > 0 && c.context > 0 && c.layers > 0 && c.heads > 0 && c.width > 0)
      << "GPT config: vocab " << c.vocab << ", context " << c.context << ", layers " << c.layers << ", heads "
      << c.heads << " and width " << c.width << " must all be positive";
  LOCKSTEP_CHECK(c.width % c.heads == 0) << "GPT config: width " << c.width << " is not divisible by heads " << c.heads
                                         << "; each head gets width / heads features, so pick a width "
                                         << "that is a multiple of " << c.heads;
}

// Linear's constructor initialized with Linear's own reset_parameter (virtual calls in a base
// constructor do not reach the derived class); redo it, so the layer alone is GPT-2's too.
double gpt_parameter_count(const GptConfig& c) {
  const double w = static_cast<double>(c.width);
  // Embeddings (the head is tied to wte); per block two LayerNorms (2w each), attention
  // (w x 3w and w x w, with biases) and the MLP (w x 4w and 4w x w, with biases); ln_f.
  const double block = 12 * w * w + 13 * w;
  return static_cast<double>(c.vocab + c.context) * w + static_cast<double>(c.layers) * block + 2 * w;
}

GptLinear::GptLinear(int64_t in, int64_t out, double stddev) : Linear(in, out), weight_stddev(stddev) {
  initialize(*this, 0);
}

GptEmbedding::GptEmbedding(int64_t num, int64_t dim) : Embedding(num, dim) { initialize(*this, 0); }

void GptLinear::reset_parameter(const std::string& name, const Tensor& parameter, Philox& rng) {
  if (name == "weight") {
    init::normal_(parameter, 0.0, weight_stddev, rng);
  } else {
    init::constant_(parameter, 0.0);
  }
}

void GptEmbedding::reset_parameter(const std::string&, const Tensor& parameter, Philox& rng) {
  init::normal_(parameter, 0.0, kInitStddev, rng);
}

CausalSelfAttention::CausalSelfAttention(const GptConfig& config)
    : Module("CausalSelfAttention"), heads(config.heads), width(config.width) {
  c_attn = register_module("c_attn", std::make_shared<GptLinear>(width, 3 * width, kInitStddev));
  c_proj = register_module("c_proj", std::make_shared<GptLinear>(width, width, residual_stddev(config)));
}

Tensor causal_attention(const Tensor& qkv, int64_t heads) {
  const int64_t b = qkv.size(0), t = qkv.size(1), width = qkv.size(2) / 3, head_dim = width / heads;
  // [B, T, width] -> [B * heads, T, head_dim]: one batched matmul covers every head.
  auto split_heads = [&](int64_t part) {
    const Tensor one = slice(qkv, 2, part * width, (part + 1) * width);
    return reshape(permute(reshape(one, {b, t, heads, head_dim}), {0, 2, 1, 3}), {b * heads, t, head_dim});
  };
  const Tensor q = split_heads(0), k = split_heads(1), v = split_heads(2);
  Tensor scores = matmul(q, transpose(k, 1, 2)) * (1.0 / std::sqrt(static_cast<double>(head_dim)));
  scores = scores + causal_mask(t, scores.device());
  const Tensor y = matmul(softmax(scores, -1), v);  // [B * heads, T, head_dim]
  return reshape(permute(reshape(y, {b, heads, t, head_dim}), {0, 2, 1, 3}), {b, t, width});
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  return (*c_proj)(causal_attention((*c_attn)(x), heads));  // c_attn: q, k, v side by side
}

GptMlp::GptMlp(const GptConfig& config) : Module("GptMlp") {
  c_fc = register_module("c_fc", std::make_shared<GptLinear>(config.width, 4 * config.width, kInitStddev));
  c_proj =
      register_module("c_proj", std::make_shared<GptLinear>(4 * config.width, config.width, residual_stddev(config)));
}

Tensor GptMlp::forward(const Tensor& x) { return (*c_proj)(gelu((*c_fc)(x))); }

GptBlock::GptBlock(const GptConfig& config) : Module("GptBlock") {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(config.width));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(config));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(config.width));
  mlp = register_module("mlp", std::make_shared<GptMlp>(config));
}

Tensor GptBlock::forward(const Tensor& x) {
  const Tensor h = x + (*attn)((*ln_1)(x));
  return h + (*mlp)((*ln_2)(h));
}

Gpt::Gpt(const GptConfig& config_, uint64_t seed) : Module("Gpt"), config(config_) {
  check_gpt_config(config);
  wte = register_module("wte", std::make_shared<GptEmbedding>(config.vocab, config.width));
  wpe = register_module("wpe", std::make_shared<GptEmbedding>(config.context, config.width));
  auto blocks = register_module("h", std::make_shared<BlockList>());
  for (int64_t i = 0; i < config.layers; ++i) {
    h.push_back(blocks->register_module(std::to_string(i), std::make_shared<GptBlock>(config)));
  }
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(config.width));
  initialize(*this, seed);
}

Tensor gpt_positions(const Tensor& tokens, const GptConfig& config) {
  LOCKSTEP_CHECK(tokens.dim() == 2) << "Gpt: tokens must be [batch, time], got " << shape_str(tokens.shape());
  const int64_t t = tokens.size(1);
  LOCKSTEP_CHECK(t <= config.context) << "Gpt: sequence length " << t << " exceeds the model's context "
                                      << config.context << "; feed at most the last " << config.context << " tokens";
  LOCKSTEP_CHECK(t > 0) << "Gpt: empty sequence (tokens " << shape_str(tokens.shape()) << ")";
  std::vector<int64_t> positions(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) positions[static_cast<size_t>(i)] = i;
  return Tensor::from_vector(positions, {t}, tokens.device());
}

Tensor Gpt::forward(const Tensor& tokens) {
  // [B, T, width] + [T, width]: the position embedding broadcasts over the batch.
  const Tensor positions = gpt_positions(tokens, config);  // checks the shape first
  Tensor x = (*wte)(tokens) + (*wpe)(positions);
  for (const std::shared_ptr<GptBlock>& block : h) {
    x = checkpoint_activations ? autograd::checkpoint([block](const Tensor& in) { return (*block)(in); }, x)
                               : (*block)(x);
  }
  x = (*ln_f)(x);
  return linear(x, wte->weight);  // tied head: x · wteᵀ, [B, T, vocab]
}

Tensor gpt_loss(const Tensor& logits, const Tensor& targets) {
  LOCKSTEP_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                 logits.size(1) == targets.size(1))
      << "gpt_loss: logits must be [B, T, V] and targets [B, T], got " << shape_str(logits.shape()) << " and "
      << shape_str(targets.shape());
  return cross_entropy(flatten(logits, 0, 1), flatten(targets, 0));
}

int64_t sample_token(const std::vector<float>& logits, double temperature, double u) {
  LOCKSTEP_CHECK(!logits.empty() && temperature > 0 && u >= 0 && u < 1)
      << "sample_token: needs logits (got " << logits.size() << "), temperature > 0 (got " << temperature
      << ") and u in [0, 1) (got " << u << ")";
  double top = -std::numeric_limits<double>::infinity();
  for (const float l : logits) top = std::max(top, static_cast<double>(l));
  std::vector<double> weights(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    weights[i] = std::exp((static_cast<double>(logits[i]) - top) / temperature);
    total += weights[i];
  }
  double cumulative = 0;
  int64_t last_possible = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] == 0) continue;
    last_possible = static_cast<int64_t>(i);
    cumulative += weights[i];
    if (u * total < cumulative) return last_possible;
  }
  return last_possible;  // u * total at the very top, where rounding left the sum short
}

namespace {

int64_t argmax_index(const std::vector<float>& logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int64_t>(best);
}

}  // namespace

std::vector<int64_t> generate(Gpt& model, const std::vector<int64_t>& prompt, int64_t count, double temperature,
                              uint64_t seed) {
  LOCKSTEP_CHECK(!prompt.empty()) << "generate: the prompt needs at least one token";
  LOCKSTEP_CHECK(count >= 0) << "generate: count must be >= 0, got " << count;
  LOCKSTEP_CHECK(temperature >= 0 && std::isfinite(temperature))
      << "generate: temperature must be >= 0 (0 is greedy), got " << temperature;
  NoGradGuard no_grad;
  std::vector<int64_t> sequence = prompt;
  std::vector<int64_t> generated;
  const int64_t vocab = model.config.vocab, context = model.config.context;
  for (int64_t n = 0; n < count; ++n) {
    const int64_t length = static_cast<int64_t>(sequence.size());
    const int64_t window = std::min(length, context);
    const std::vector<int64_t> fed(sequence.end() - window, sequence.end());
    const Tensor logits = model.forward(Tensor::from_vector(fed, {1, window}, model.wte->weight.device()));
    const std::vector<float> last = slice(logits, 1, window - 1, window).to_vector<float>();
    LOCKSTEP_CHECK(static_cast<int64_t>(last.size()) == vocab)
        << "generate: logits of " << last.size() << " classes for a vocabulary of " << vocab;
    int64_t next = 0;
    if (temperature == 0) {
      next = argmax_index(last);
    } else {
      // Keyed by the position the token takes in the whole sequence.
      Philox rng(seed, static_cast<uint64_t>(RngStream::sample), static_cast<uint64_t>(length));
      next = sample_token(last, temperature, rng.next_double());
    }
    sequence.push_back(next);
    generated.push_back(next);
  }
  return generated;
}

}  // namespace lockstep::nn
