// One device's part of a GPT on a tensor × pipeline layout: the consecutive blocks of one
// pipeline stage, each cut across the stage's tensor-parallel group (tensor_parallel_gpt.h)
// or whole on a group of one. The first stage also holds the embeddings, the last the final
// layer norm and the head tied to the token embedding. On a group of one, every layer is a
// copy of the full model's own, so the stage computes exactly what the full model does
// there: a pipeline gives the bits of one device.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/nn/gpt.h"
#include "lockstep/parallel/shard.h"

namespace lockstep::parallel {

struct GptStagePlan {
  int stage = 0, stages = 1;
  int64_t first_block = 0, end_block = 0;  // blocks [first_block, end_block) of the full model
};

// The stage plans for `stages` stages of blocks_per_stage[s] blocks each.
std::vector<GptStagePlan> gpt_stage_plans(const std::vector<int64_t>& blocks_per_stage);

class GptStage : public nn::Module {
 public:
  // Copies this stage's layers of `full` (this rank's shards of them where tp_group has more
  // than one rank). Parameter names are the full model's ("h.3.ln_1.weight"), but for the
  // cut layers of a tensor-parallel block (shard_specs() maps every name).
  GptStage(const nn::Gpt& full, const GptStagePlan& plan, std::shared_ptr<comm::Communicator> tp_group);

  bool first() const { return plan.stage == 0; }
  bool last() const { return plan.stage == plan.stages - 1; }
  // The first stage takes tokens [m, T], the others the previous stage's activations
  // [m, T, width]; the last returns this rank's columns of the logits [m, T, vocab / tp],
  // the others activations [m, T, width].
  Tensor forward(const Tensor& input) override;
  // Last stage: the cross-entropy summed over every position of targets [m, T] (the same
  // on every rank of the tensor-parallel group).
  Tensor loss_sum(const Tensor& logits, const Tensor& targets);

  // Per parameter, in named_parameters() order: the full model's tensor it is (a shard of).
  std::vector<ShardSpec> shard_specs() const;

  const nn::GptConfig config;
  const GptStagePlan plan;
  // Recompute each block in backward (autograd/checkpoint.h): less memory, the same bits.
  bool checkpoint_activations = false;
  // The head's weight on the last stage (this rank's rows of the token embedding). Where the
  // last stage is also the first, it is the embedding's own weight; otherwise a copy that is
  // no parameter of this stage: the first stage trains the tied weight and sends it over.
  Tensor head_weight;

 private:
  std::shared_ptr<comm::Communicator> tp_;
  int64_t vocab_first_ = 0;  // the first token row this rank holds
  std::shared_ptr<nn::Module> wte_, wpe_;
  std::vector<std::shared_ptr<nn::Module>> blocks_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
};

}  // namespace lockstep::parallel
