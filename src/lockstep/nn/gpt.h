// A decoder-only transformer (GPT-2's architecture) over byte tokens, built from the existing
// ops and layers. Parameter names, layouts and initialization follow GPT-2 / nanoGPT without
// the "transformer." prefix and without a separate lm_head (the head is tied to wte), so
// weights move between Lockstep and the PyTorch module in tests/fixtures/torch_models.py
// (class GPT) unchanged:
//   wte.weight [vocab, width], wpe.weight [context, width],
//   h.<i>.ln_1, h.<i>.attn.c_attn (width -> 3 width: q, k, v), h.<i>.attn.c_proj,
//   h.<i>.ln_2, h.<i>.mlp.c_fc (width -> 4 width), h.<i>.mlp.c_proj, ln_f.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/nn/embedding.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/module.h"
#include "lockstep/nn/normalization.h"

namespace lockstep::nn {

struct GptConfig {
  int64_t vocab = 256;  // byte-level tokens
  int64_t context = 64;
  int64_t layers = 2;
  int64_t heads = 2;
  int64_t width = 64;
};

// "tiny" (trains in about a minute on two CPU cores), "small", "gpt2-124m" (GPT-2's shape with
// a 256-token vocabulary). An unknown name is an Error listing the choices.
GptConfig gpt_preset(const std::string& name);
std::vector<std::string> gpt_preset_names();
// Throws an Error naming the first value that cannot build a model (non-positive sizes, a
// width the heads do not divide).
void check_gpt_config(const GptConfig& config);
// The model's parameter count, computed (not built; a double, so no shape overflows it):
// what a planner checks against memory before it allocates.
double gpt_parameter_count(const GptConfig& config);

// GPT-2's init: weights N(0, stddev), bias zero. A Linear of its own so nn::initialize (which
// asks each parameter's owner) draws GPT-2's values instead of PyTorch's Linear default.
class GptLinear : public Linear {
 public:
  GptLinear(int64_t in_features, int64_t out_features, double weight_stddev);
  void reset_parameter(const std::string& name, const Tensor& parameter, Philox& rng) override;
  const double weight_stddev;
};

// An Embedding initialized N(0, 0.02) as GPT-2's, not torch.nn.Embedding's N(0, 1).
class GptEmbedding : public Embedding {
 public:
  GptEmbedding(int64_t num_embeddings, int64_t embedding_dim);
  void reset_parameter(const std::string& name, const Tensor& parameter, Philox& rng) override;
};

// The attention itself: qkv [B, T, 3·w] (q, k, v side by side, each `heads` heads of w/heads)
// -> [B, T, w], position t attending to positions <= t. A tensor-parallel rank calls it on
// its own heads.
Tensor causal_attention(const Tensor& qkv, int64_t heads);

// Multi-head self-attention where position t sees positions <= t only.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const GptConfig& config);
  Tensor forward(const Tensor& x) override;  // [B, T, width] -> [B, T, width]

  const int64_t heads, width;
  std::shared_ptr<GptLinear> c_attn, c_proj;
};

class GptMlp : public Module {
 public:
  GptMlp(const GptConfig& config);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<GptLinear> c_fc, c_proj;
};

// x + attn(ln_1(x)), then x + mlp(ln_2(x)) (pre-norm residual block).
class GptBlock : public Module {
 public:
  GptBlock(const GptConfig& config);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<GptMlp> mlp;
};

class Gpt : public Module {
 public:
  // Initialized by initialize(*this, seed): the same seed gives the same bits anywhere.
  explicit Gpt(const GptConfig& config, uint64_t seed = 0);
  // tokens [B, T] (i64 or i32, each in [0, vocab)), T <= context -> logits [B, T, vocab].
  Tensor forward(const Tensor& tokens) override;

  const GptConfig config;
  // Recompute each block in backward instead of keeping its activations
  // (autograd/checkpoint.h): less memory, one more forward per block, the same bits.
  bool checkpoint_activations = false;
  std::shared_ptr<GptEmbedding> wte, wpe;
  std::vector<std::shared_ptr<GptBlock>> h;
  std::shared_ptr<LayerNorm> ln_f;
};

// The positions 0 .. T-1 of tokens [B, T] (on their device), for the position embedding;
// an Error unless 0 < T <= config.context.
Tensor gpt_positions(const Tensor& tokens, const GptConfig& config);

// Mean cross-entropy of logits [B, T, V] against targets [B, T] (the next tokens).
Tensor gpt_loss(const Tensor& logits, const Tensor& targets);

// The token inverse-CDF sampling picks from softmax(logits / temperature) for a uniform u in
// [0, 1): the first i whose cumulative probability exceeds u, computed in double, so the
// choice depends on nothing but the logits and u. temperature must be > 0.
int64_t sample_token(const std::vector<float>& logits, double temperature, double u);

// Appends `count` tokens to `prompt` (non-empty) and returns the new ones. Each is drawn from
// softmax(logits / temperature) of the last position, with the uniform number from Philox
// keyed by (seed, RngStream::sample, its position in the whole sequence): the same seed gives
// the same text, whatever was generated before. temperature 0 takes the most likely token
// (the first on ties). Only the last `context` tokens are fed (the window slides). Runs
// without autograd; the model is left as it was found (train or eval).
std::vector<int64_t> generate(Gpt& model, const std::vector<int64_t>& prompt, int64_t count, double temperature,
                              uint64_t seed);

}  // namespace lockstep::nn
