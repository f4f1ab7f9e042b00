// A GPT cut across a tensor-parallel group, Megatron-LM's way. A block: attention by heads
// (c_attn column-parallel over q, k and v alike, c_proj row-parallel), the MLP column-then-
// row, the layer norms replicated; each sublayer costs one all-reduce forward and one
// backward. The model: the token embedding and the tied head cut by vocabulary
// (vocab_parallel.h), the position embedding and the final layer norm replicated. Built
// from a full nn::Gpt / nn::GptBlock, so it starts with those weights.
#pragma once

#include <memory>

#include "lockstep/nn/gpt.h"
#include "lockstep/parallel/tensor_parallel.h"
#include "lockstep/parallel/vocab_parallel.h"

namespace lockstep::parallel {

class TensorParallelGptBlock : public nn::Module {
 public:
  // `heads`: the full block's; the group's size must divide it (and the MLP's width).
  TensorParallelGptBlock(const nn::GptBlock& full, int64_t heads, std::shared_ptr<comm::Communicator> group);
  Tensor forward(const Tensor& x) override;  // [B, T, width] on every rank -> the same

  const int64_t local_heads;  // this rank's share
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<ColumnParallelLinear> attn_qkv, mlp_fc;
  std::shared_ptr<RowParallelLinear> attn_proj, mlp_proj;
};

class TensorParallelGpt : public nn::Module {
 public:
  TensorParallelGpt(const nn::Gpt& full, std::shared_ptr<comm::Communicator> group);
  // tokens [B, T] -> this rank's columns of the logits, [B, T, vocab/T].
  Tensor forward(const Tensor& tokens) override;
  // The mean cross-entropy over every position, the same on every rank.
  Tensor loss(const Tensor& tokens, const Tensor& targets);

  const nn::GptConfig config;
  std::shared_ptr<VocabParallelEmbedding> wte;
  std::shared_ptr<nn::GptEmbedding> wpe;
  std::vector<std::shared_ptr<TensorParallelGptBlock>> h;
  std::shared_ptr<nn::LayerNorm> ln_f;

 private:
  std::shared_ptr<comm::Communicator> group_;
};

}  // namespace lockstep::parallel
