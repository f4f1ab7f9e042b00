#include "lockstep/parallel/gpt_stage.h"

#include "lockstep/autograd/checkpoint.h"
#include "lockstep/autograd/grad_mode.h"
#include "lockstep/ops/ops.h"
#include "lockstep/parallel/tensor_parallel.h"
#include "lockstep/parallel/tensor_parallel_gpt.h"
#include "lockstep/parallel/vocab_parallel.h"

namespace lockstep::parallel {
namespace {

class BlockList : public nn::Module {
 public:
  BlockList() : Module("ModuleList") {}
};

template <typename M>
std::shared_ptr<M> copy_of(const M& original, std::shared_ptr<M> fresh) {
  fresh->load_state_dict(original.state_dict());
  return fresh;
}

// A tensor-parallel block's layer names, and the full block's names and cut axes for them.
struct CutLayer {
  const char* local;
  const char* full;
  int64_t weight_axis, bias_axis, parts;
};
constexpr CutLayer kCutLayers[] = {
    {".attn_qkv.", ".attn.c_attn.", 0, 0, 3},
    {".attn_proj.", ".attn.c_proj.", 1, -1, 1},
    {".mlp_fc.", ".mlp.c_fc.", 0, 0, 1},
    {".mlp_proj.", ".mlp.c_proj.", 1, -1, 1},
};

}  // namespace

std::vector<GptStagePlan> gpt_stage_plans(const std::vector<int64_t>& blocks_per_stage) {
  std::vector<GptStagePlan> plans;
  int64_t block = 0;
  const int stages = static_cast<int>(blocks_per_stage.size());
  for (int s = 0; s < stages; ++s) {
    plans.push_back({.stage = s, .stages = stages, .first_block = block, .end_block = block + blocks_per_stage[s]});
    block += blocks_per_stage[s];
  }
  return plans;
}

GptStage::GptStage(const nn::Gpt& full, const GptStagePlan& plan_, std::shared_ptr<comm::Communicator> tp_group)
    : Module("GptStage"), config(full.config), plan(plan_), tp_(std::move(tp_group)) {
  LOCKSTEP_CHECK(plan.stages >= 1 && plan.stage >= 0 && plan.stage < plan.stages && plan.first_block >= 0 &&
                 plan.first_block < plan.end_block && plan.end_block <= config.layers)
      << "GptStage: stage " << plan.stage << " of " << plan.stages << " with blocks [" << plan.first_block << ", "
      << plan.end_block << ") of a " << config.layers << "-block model";
  const bool cut = tp_->size() > 1;
  LOCKSTEP_CHECK(!cut || config.vocab % tp_->size() == 0)
      << "tensor parallelism cuts the vocabulary: " << config.vocab << " tokens do not go to " << tp_->size()
      << " ranks; use a tensor-parallel size that divides " << config.vocab;
  if (first() || last()) {
    if (cut) {
      auto wte = std::make_shared<VocabParallelEmbedding>(full.wte->weight, tp_);
      vocab_first_ = wte->first;
      head_weight = wte->weight;
      wte_ = wte;
    } else {
      auto wte = copy_of(*full.wte, std::make_shared<nn::GptEmbedding>(config.vocab, config.width));
      head_weight = wte->weight;
      wte_ = wte;
    }
    if (first()) {
      register_module("wte", wte_);
    } else {
      // A copy the first stage keeps up to date; its gradient goes to the first stage.
      head_weight = head_weight.detach().set_requires_grad(true);
      wte_ = nullptr;
    }
  }
  if (first()) {
    wpe_ = register_module("wpe", copy_of(*full.wpe, std::make_shared<nn::GptEmbedding>(config.context, config.width)));
  }
  auto list = register_module("h", std::make_shared<BlockList>());
  for (int64_t i = plan.first_block; i < plan.end_block; ++i) {
    const nn::GptBlock& block = *full.h[static_cast<size_t>(i)];
    std::shared_ptr<nn::Module> part;
    if (cut) {
      part = std::make_shared<TensorParallelGptBlock>(block, config.heads, tp_);
    } else {
      part = copy_of(block, std::make_shared<nn::GptBlock>(config));
    }
    blocks_.push_back(list->register_module(std::to_string(i), part));
  }
  if (last()) ln_f_ = register_module("ln_f", copy_of(*full.ln_f, std::make_shared<nn::LayerNorm>(config.width)));
}

Tensor GptStage::forward(const Tensor& input) {
  Tensor x = input;
  if (first()) {
    const Tensor positions = nn::gpt_positions(input, config);  // checks the shape first
    x = wte_->forward(input) + wpe_->forward(positions);
  }
  for (const auto& block : blocks_) {
    x = checkpoint_activations ? autograd::checkpoint([block](const Tensor& in) { return block->forward(in); }, x)
                               : block->forward(x);
  }
  if (!last()) return x;
  x = ln_f_->forward(x);
  // The tied head: this rank's rows of the table give its columns of the logits.
  return tp_->size() > 1 ? linear(copy_to_tensor_parallel(x, tp_), head_weight) : linear(x, head_weight);
}

Tensor GptStage::loss_sum(const Tensor& logits, const Tensor& targets) {
  LOCKSTEP_CHECK(last()) << "GptStage: only the last pipeline stage computes the loss (this is stage " << plan.stage
                         << " of " << plan.stages << ")";
  const Tensor flat_logits = flatten(logits, 0, -2);  // [predictions, vocab / tp]
  const Tensor flat_targets = flatten(targets.contiguous(), 0);
  if (tp_->size() == 1) return cross_entropy(flat_logits, flat_targets, Reduction::sum);
  return sum(vocab_parallel_cross_entropy(flat_logits, flat_targets, vocab_first_, tp_));
}

std::vector<ShardSpec> GptStage::shard_specs() const {
  std::vector<ShardSpec> specs;
  for (const auto& [name, parameter] : named_parameters()) {
    ShardSpec spec{.full_name = name};
    if (name == "wte.weight") spec.axis = 0;
    for (const CutLayer& layer : kCutLayers) {
      const size_t at = name.find(layer.local);
      if (at == std::string::npos) continue;
      const bool weight = name.ends_with(".weight");
      spec.full_name = name.substr(0, at) + layer.full + name.substr(at + std::string(layer.local).size());
      spec.axis = weight ? layer.weight_axis : layer.bias_axis;
      spec.parts = layer.parts;
    }
    specs.push_back(spec);
  }
  return specs;
}

}  // namespace lockstep::parallel
