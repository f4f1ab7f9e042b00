// A GPT cut across a tensor-parallel group, Megatron-LM's way. A block: attention by heads
// (c_attn column-parallel over q, k and v alike, c_proj row-parallel), the MLP column-then-
// row, the layer norms replicated; each sublayer costs one all-reduce forward and one
// backward. Built from a full nn::GptBlock, so it starts with its weights. A whole model
// (the vocabulary cut too, vocab_parallel.h) is a GptStage (gpt_stage.h).
#pragma once

#include <memory>

#include "lockstep/nn/gpt.h"
#include "lockstep/parallel/tensor_parallel.h"

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

}  // namespace lockstep::parallel
