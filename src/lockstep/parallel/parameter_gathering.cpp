#include "lockstep/parallel/parameter_gathering.h"

#include <algorithm>
#include <unordered_map>

#include "lockstep/autograd/node.h"

namespace lockstep::parallel {

GatherPlan plan_gathering(nn::Module& model, const std::vector<std::string>& unit_types) {
  const std::vector<Tensor> params = model.parameters();
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) index.emplace(params[i].impl(), i);

  std::vector<nn::Module*> candidates;
  if (unit_types.empty()) {
    for (const auto& [name, child] : model.named_children()) candidates.push_back(child.get());
  } else {
    std::vector<std::string> taken;  // the candidates' names: their descendants are inside them
    for (const auto& [name, module] : model.named_modules()) {
      if (name.empty() || std::find(unit_types.begin(), unit_types.end(), module->type_name()) == unit_types.end())
        continue;
      const bool nested = std::any_of(taken.begin(), taken.end(),
                                      [&](const std::string& outer) { return name.starts_with(outer + "."); });
      if (nested) continue;
      taken.push_back(name);
      candidates.push_back(module);
    }
    LOCKSTEP_CHECK(!candidates.empty()) << "ZeRO-3: no module of the model has a unit type given ("
                                        << unit_types.front() << (unit_types.size() > 1 ? ", ..." : "")
                                        << "): name the type_name() of the modules to gather one at a time";
  }
  // Which candidates use each parameter.
  std::vector<std::vector<size_t>> users(params.size());
  for (size_t c = 0; c < candidates.size(); ++c) {
    for (const Tensor& p : candidates[c]->parameters()) users[index.at(p.impl())].push_back(c);
  }
  GatherPlan plan;
  plan.group_of.assign(params.size(), 0);
  std::vector<size_t> group_of_candidate(candidates.size(), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    if (users[i].size() != 1) continue;  // outside every unit, or shared by two
    size_t& group = group_of_candidate[users[i].front()];
    if (group == 0) {
      plan.modules.push_back(candidates[users[i].front()]);
      group = plan.modules.size();
    }
    plan.group_of[i] = group;
  }
  for (size_t i = params.size(); i-- > 0;) {
    if (i + 1 == params.size() || plan.group_of[i] != plan.group_of[i + 1]) plan.unit_sizes.push_back(0);
    ++plan.unit_sizes.back();
  }
  return plan;
}

ParameterGathering::ParameterGathering(const GatherPlan& plan, const FlatGradients& layout, ShardedWeights& weights)
    : weights_(weights), modules_(plan.modules), group_of_(plan.group_of) {
  const size_t groups = modules_.size() + 1;
  units_of_.resize(groups);
  sizes_.assign(groups, 0);
  for (size_t u = 0; u < layout.units().size(); ++u)
    units_of_[group_of_.at(layout.units()[u].params.front())].push_back(u);
  for (size_t g : group_of_) ++sizes_[g];
  waiting_ = sizes_;
  for (size_t g = 1; g < groups; ++g) {
    modules_[g - 1]->set_forward_hooks([this, g] { before_forward(g); },
                                       [this, g](const Tensor& output) { return after_forward(g, output); });
  }
}

ParameterGathering::~ParameterGathering() {
  for (nn::Module* module : modules_) module->set_forward_hooks(nullptr, nullptr);
}

void ParameterGathering::gather(size_t group) {
  for (size_t u : units_of_[group]) weights_.prefetch(u);
  for (size_t u : units_of_[group]) weights_.gather(u);
}

void ParameterGathering::prefetch(size_t group) {
  for (size_t u : units_of_[group]) weights_.prefetch(u);
}

void ParameterGathering::release(size_t group) {
  for (size_t u : units_of_[group]) weights_.release(u);
}

void ParameterGathering::begin_pass() {
  in_pass_ = true;
  backward_started_ = false;
  waiting_ = sizes_;
  order_.clear();
  gather(0);
}

void ParameterGathering::end_pass() {
  in_pass_ = false;
  for (size_t g = 1; g < units_of_.size(); ++g) release(g);
  last_order_ = order_;
}

void ParameterGathering::end_step() { weights_.release_all(); }

void ParameterGathering::gather_all() { weights_.gather_all(); }

void ParameterGathering::abandon() {
  in_pass_ = false;
  weights_.abandon();
}

void ParameterGathering::before_forward(size_t group) {
  if (!in_pass_) return;  // outside a step every parameter is gathered (gather_all) or none is used
  gather(group);
  if (backward_started_) return;  // checkpointing's forward again, inside backward
  order_.push_back(group);
  // The group the last pass forwarded next, most likely this pass's next too.
  const size_t next = order_.size();
  if (next < last_order_.size() && last_order_[next] != group) prefetch(last_order_[next]);
}

Tensor ParameterGathering::after_forward(size_t group, const Tensor& output) {
  if (!in_pass_) return output;
  // Checkpointing's forward again, inside backward: its backward follows at once, and the
  // group goes when its gradients are in.
  if (backward_started_) return output;
  release(group);                                      // gathered again for backward
  if (!autograd::needs_grad({output})) return output;  // under checkpointing, backward runs the forward again
  // An identity whose backward runs before any of the unit's own: it gathers the unit then.
  Tensor marked = output.detach();
  const size_t position = order_.size() - 1;
  autograd::record("ZeroGather", {output}, {marked}, [this, group, position](const std::vector<Tensor>& grads) {
    before_backward(group, position);
    return grads;
  });
  return marked;
}

void ParameterGathering::before_backward(size_t group, size_t position) {
  backward_started_ = true;
  if (waiting_[group] == 0) return;  // its gradients are all in: nothing of it runs again
  gather(group);
  // Backward meets the units in the reverse of forward's order: the one before is next.
  if (position > 0 && order_[position - 1] != group && waiting_[order_[position - 1]] > 0)
    prefetch(order_[position - 1]);
}

void ParameterGathering::gradient_done(size_t param) {
  const size_t group = group_of_.at(param);
  if (!in_pass_ || waiting_[group] == 0) return;
  backward_started_ = true;
  if (--waiting_[group] == 0 && group != 0) release(group);
}

}  // namespace lockstep::parallel
