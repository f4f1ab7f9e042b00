#include "lockstep/parallel/tensor_parallel_gpt.h"

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/ops/ops.h"

namespace lockstep::parallel {
namespace {

// A copy of a replicated layer norm.
std::shared_ptr<nn::LayerNorm> replicate(const nn::LayerNorm& full) {
  auto copy = std::make_shared<nn::LayerNorm>(full.normalized_shape, full.eps, full.weight.defined());
  NoGradGuard no_grad;
  if (full.weight.defined()) {
    copy->weight.copy_from(full.weight);
    copy->bias.copy_from(full.bias);
  }
  return copy;
}

}  // namespace

TensorParallelGptBlock::TensorParallelGptBlock(const nn::GptBlock& full, int64_t heads,
                                               std::shared_ptr<comm::Communicator> group)
    : Module("TensorParallelGptBlock"), local_heads(heads / group->size()) {
  LOCKSTEP_CHECK(heads % group->size() == 0)
      << "tensor parallelism cuts attention by heads: " << heads << " heads do not go to " << group->size()
      << " ranks; use a tensor-parallel size that divides the head count";
  ln_1 = register_module("ln_1", replicate(*full.ln_1));
  attn_qkv = register_module("attn_qkv", std::make_shared<ColumnParallelLinear>(*full.attn->c_attn, group, 3));
  attn_proj = register_module("attn_proj", std::make_shared<RowParallelLinear>(*full.attn->c_proj, group));
  ln_2 = register_module("ln_2", replicate(*full.ln_2));
  mlp_fc = register_module("mlp_fc", std::make_shared<ColumnParallelLinear>(*full.mlp->c_fc, group));
  mlp_proj = register_module("mlp_proj", std::make_shared<RowParallelLinear>(*full.mlp->c_proj, group));
}

Tensor TensorParallelGptBlock::forward(const Tensor& x) {
  const Tensor h = x + attn_proj->forward(nn::causal_attention(attn_qkv->forward(ln_1->forward(x)), local_heads));
  return h + mlp_proj->forward(gelu(mlp_fc->forward(ln_2->forward(h))));
}

}  // namespace lockstep::parallel
