#include "lockstep/parallel/sharded_optimizer.h"

#include <map>

#include "lockstep/ops/ops.h"

namespace lockstep::parallel {

ShardedOptimizer::ShardedOptimizer(const FlatGradients& layout, comm::Communicator& comm,
                                   const OptimizerFactory& make_optimizer, bool share_weights, bool shard_weights)
    : layout_(layout), comm_(comm) {
  LOCKSTEP_CHECK(layout.shards() % comm.size() == 0)
      << "the flat buffer's units are padded for " << layout.shards() << " shards, which do not cut into "
      << comm.size() << " ranks' parts: build its FlatGradients with shards = " << comm.size();
  if (shard_weights) {
    sharded_weights_ = std::make_unique<ShardedWeights>(layout, comm);
    parts_ = sharded_weights_->parts();  // the same tensors: the optimizer steps them in place
    optimizer_ = make_optimizer(parts_);
    return;
  }
  // The parameters move into one flat buffer, so this rank's parts are views of it: the
  // optimizer updates the weights in place, and no second copy of them is kept.
  const Tensor values = layout.gather_values();
  if (share_weights) weights_ = comm.empty_common(values.shape(), values.dtype(), values.device());
  common_ = weights_.defined();
  if (!common_) weights_ = values;
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const int64_t begin = part_begin(u);
    parts_.push_back(slice(weights_, 0, begin, begin + layout.units()[u].shard_size(comm.size())));
  }
  if (common_) {
    // Every rank holds the same values: each writes its own parts of the one copy.
    for (size_t u = 0; u < parts_.size(); ++u) {
      const int64_t begin = part_begin(u);
      parts_[u].copy_from(slice(values, 0, begin, begin + parts_[u].numel()));
    }
    comm.barrier();
  }
  for (size_t i = 0; i < layout.params().size(); ++i) layout.params()[i].set_data(layout.view(weights_, i));
  for (Tensor& part : parts_) part.set_requires_grad(true);
  optimizer_ = make_optimizer(parts_);
}

int64_t ShardedOptimizer::part_begin(size_t unit) const {
  const FlatUnit& u = layout_.units().at(unit);
  return u.begin + u.shard_size(comm_.size()) * comm_.rank();
}

void ShardedOptimizer::step(const Tensor& gradients, DeviceTimes& times, const Tensor& given_shard,
                            const UpdateGate& gate) {
  const StepClock::time_point start = StepClock::now();
  const Tensor grad_shard =
      given_shard.defined() ? given_shard : Tensor::empty({shard_size()}, gradients.dtype(), gradients.device());
  LOCKSTEP_CHECK(grad_shard.numel() == shard_size())
      << "a shard of gradients holds " << shard_size() << " elements here, got " << grad_shard.numel();
  std::vector<comm::Work> works;
  for (const FlatUnit& unit : layout_.units()) {
    const int64_t at = shard_offset(unit, comm_.size());
    works.push_back(comm_.reduce_scatter_async(slice(gradients, 0, unit.begin, unit.end),
                                               slice(grad_shard, 0, at, at + unit.shard_size(comm_.size()))));
  }
  for (const comm::Work& work : works) work.wait();
  times.communicate += seconds_since(start);
  step_shard(grad_shard, times, gate);
}

void ShardedOptimizer::step_reduced(const Tensor& sums, DeviceTimes& times, const UpdateGate& gate) {
  std::vector<Tensor> grads;
  for (size_t u = 0; u < parts_.size(); ++u)
    grads.push_back(slice(sums, 0, part_begin(u), part_begin(u) + parts_[u].numel()));
  update(std::move(grads), times, gate);
}

void ShardedOptimizer::step_shard(const Tensor& grad_shard, DeviceTimes& times, const UpdateGate& gate) {
  LOCKSTEP_CHECK(grad_shard.numel() == shard_size())
      << "a shard of gradients holds " << shard_size() << " elements here, got " << grad_shard.numel();
  std::vector<Tensor> grads;
  for (size_t u = 0; u < parts_.size(); ++u) {
    const int64_t at = shard_offset(layout_.units()[u], comm_.size());
    grads.push_back(slice(grad_shard, 0, at, at + parts_[u].numel()));
  }
  update(std::move(grads), times, gate);
}

void ShardedOptimizer::update(std::vector<Tensor> grads, DeviceTimes& times, const UpdateGate& gate) {
  StepClock::time_point start = StepClock::now();
  if (gate && !gate(grads)) {  // every rank skips alike: nothing changed, nothing to gather
    times.optimizer += seconds_since(start);
    return;
  }
  for (size_t u = 0; u < parts_.size(); ++u) parts_[u].set_grad(grads[u]);
  optimizer_->step();
  // The parts are gathered (or the ranks told they are written) right away, so an offloaded
  // update is never left to the background here (no read guard covers the parts): should one
  // ever be, this is where the gather waits for it.
  optimizer_->wait_for_updates();
  optimizer_->zero_grad();
  grads.clear();
  times.optimizer += seconds_since(start);
  if (sharded_weights_) return;  // each unit is gathered when next used
  start = StepClock::now();
  if (common_) {
    comm_.barrier();  // no rank computes with the weights before every part is updated
  } else {
    // In place: each part is its own slice of its unit in weights_.
    std::vector<comm::Work> works;
    for (size_t u = 0; u < parts_.size(); ++u) {
      const FlatUnit& unit = layout_.units()[u];
      works.push_back(comm_.all_gather_async(parts_[u], slice(weights_, 0, unit.begin, unit.end)));
    }
    for (const comm::Work& work : works) work.wait();
  }
  times.communicate += seconds_since(start);
}

Tensor ShardedOptimizer::gather_slot(size_t slot, int root) {
  const bool assembles = root < 0 || comm_.rank() == root;
  const Tensor full = assembles ? layout_.empty_buffer() : Tensor();
  for (size_t u = 0; u < parts_.size(); ++u) {
    const FlatUnit& unit = layout_.units()[u];
    Tensor part = optimizer_->state(u, slot).reshape({parts_[u].numel()});
    // Offloaded state lives in host memory, which a GPU's collectives cannot read.
    if (!same_memory(part.device(), parts_[u].device())) part = part.to(parts_[u].device());
    if (root < 0) {
      comm_.all_gather(part, slice(full, 0, unit.begin, unit.end));
    } else if (!assembles) {
      comm_.send(part.contiguous(), root);
    } else {
      // Rank r's part is the r-th run of part-size elements of the unit, as all_gather lays it out.
      for (int r = 0; r < comm_.size(); ++r) {
        const int64_t begin = unit.begin + part.numel() * r;
        const Tensor theirs = slice(full, 0, begin, begin + part.numel());
        if (r == root) {
          theirs.copy_from(part);
        } else {
          comm_.recv(theirs, r);
        }
      }
    }
  }
  return full;
}

NamedTensors ShardedOptimizer::full_state_dict(int root) {
  const bool assembles = root < 0 || comm_.rank() == root;
  // Every part is stepped together, so a slot exists for all of them or for none.
  const std::vector<optim::StateSlot>& slots = optimizer_->slots();
  std::vector<size_t> present;
  std::vector<Tensor> values;  // per present slot: the full buffer, or the scalar every parameter shares
  for (size_t s = 0; s < slots.size(); ++s) {
    if (!optimizer_->state(0, s).defined()) continue;
    present.push_back(s);
    values.push_back(slots[s].per_element ? gather_slot(s, root) : optimizer_->state(0, s));
  }
  if (!assembles) return {};
  NamedTensors out;
  for (const auto& [key, tensor] : optimizer_->state_dict()) {
    size_t index = 0;
    std::string slot;
    if (!optim::parse_state_key(key, index, slot)) out.emplace_back(key, tensor.clone());  // "step"
  }
  // The unsharded optimizer's order: per parameter, its slots.
  for (size_t i = 0; i < layout_.params().size(); ++i) {
    for (size_t k = 0; k < present.size(); ++k) {
      const optim::StateSlot& slot = slots[present[k]];
      out.emplace_back(optim::state_key(i, slot.name),
                       slot.per_element ? layout_.view(values[k], i).clone() : values[k].clone());
    }
  }
  return out;
}

void ShardedOptimizer::load_full_state_dict(const NamedTensors& state) {
  // Per slot, the full flat buffer (zeros for a parameter that had none), then this rank's parts.
  std::map<std::string, Tensor> per_element;
  std::map<std::string, Tensor> scalars;
  NamedTensors parts_state;
  for (const auto& [key, tensor] : state) {
    size_t index = 0;
    std::string slot;
    if (!optim::parse_state_key(key, index, slot)) {
      parts_state.emplace_back(key, tensor);
      continue;
    }
    LOCKSTEP_CHECK(index < layout_.params().size())
        << key << ": parameter " << index << " does not exist, the model has " << layout_.params().size();
    const Tensor& param = layout_.params()[index];
    if (tensor.numel() != param.numel() || tensor.shape() != param.shape()) {
      scalars.emplace(slot, tensor);  // a per-parameter scalar, the same for all
      continue;
    }
    auto [it, fresh] = per_element.emplace(slot, Tensor());
    if (fresh) {
      it->second = layout_.empty_buffer();
      it->second.zero();
    }
    layout_.view(it->second, index).copy_from(tensor);
  }
  for (size_t u = 0; u < parts_.size(); ++u) {
    const int64_t begin = part_begin(u);
    for (const auto& [slot, full] : per_element)
      parts_state.emplace_back(optim::state_key(u, slot), slice(full, 0, begin, begin + parts_[u].numel()).clone());
    for (const auto& [slot, value] : scalars) parts_state.emplace_back(optim::state_key(u, slot), value);
  }
  optimizer_->load_state_dict(parts_state);
}

}  // namespace lockstep::parallel
