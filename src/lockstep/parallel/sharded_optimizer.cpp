#include "lockstep/parallel/sharded_optimizer.h"

#include <map>

#include "lockstep/ops/ops.h"

namespace lockstep::parallel {
ShardedOptimizer::ShardedOptimizer(const FlatGradients& layout, comm::Communicator& comm,
                                   const OptimizerFactory& make_optimizer)
    : layout_(layout), comm_(comm) {
  LOCKSTEP_CHECK(layout.padded_numel() % comm.size() == 0)
      << "the flat buffer (" << layout.padded_numel() << " elements) does not cut into " << comm.size()
      << " equal shards: build its FlatGradients with shards = " << comm.size();
  // The parameters move into one flat buffer, so this rank's shard is a view of it: the
  // optimizer updates the weights in place, and no second copy of them is kept.
  const Tensor values = layout.gather_values();
  const int64_t size = layout.padded_numel() / comm.size();
  const int64_t begin = size * comm.rank(), end = begin + size;
  weights_ = comm.empty_common(values.shape(), values.dtype(), values.device());
  common_ = weights_.defined();
  if (common_) {
    // Every rank holds the same values: each writes its own shard of the one copy.
    slice(weights_, 0, begin, end).copy_from(slice(values, 0, begin, end));
    comm.barrier();
  } else {
    weights_ = values;
  }
  for (size_t i = 0; i < layout.params().size(); ++i) layout.params()[i].set_data(layout.view(weights_, i));
  shard_ = slice(weights_, 0, begin, end);
  shard_.set_requires_grad(true);
  optimizer_ = make_optimizer({shard_});
}

void ShardedOptimizer::step(const Tensor& gradients, DeviceTimes& times) {
  const StepClock::time_point start = StepClock::now();
  Tensor grad_shard = Tensor::empty({shard_size()}, gradients.dtype(), gradients.device());
  comm_.reduce_scatter(gradients, grad_shard);
  times.communicate += seconds_since(start);
  update(std::move(grad_shard), times);
}

void ShardedOptimizer::step_reduced(const Tensor& sums, DeviceTimes& times) {
  update(slice(sums, 0, shard_begin(), shard_begin() + shard_size()), times);
}

void ShardedOptimizer::update(Tensor grad_shard, DeviceTimes& times) {
  StepClock::time_point start = StepClock::now();
  shard_.set_grad(grad_shard);
  optimizer_->step();
  optimizer_->zero_grad();
  grad_shard = Tensor();
  times.optimizer += seconds_since(start);
  start = StepClock::now();
  if (common_) {
    comm_.barrier();  // no rank computes with the weights before every shard is updated
  } else {
    comm_.all_gather(shard_, weights_);  // in place: the shard is its own slice of weights_
  }
  times.communicate += seconds_since(start);
}

NamedTensors ShardedOptimizer::full_state_dict(int root) {
  // Per slot, in the optimizer's order: the full flat buffer, or a per-parameter scalar
  // (AdamW's step count, the same for every parameter).
  const bool assembles = root < 0 || comm_.rank() == root;
  NamedTensors out;
  std::vector<std::pair<std::string, Tensor>> slots;
  std::vector<bool> per_element;
  for (const auto& [key, tensor] : optimizer_->state_dict()) {
    size_t index = 0;
    std::string slot;
    if (!optim::parse_state_key(key, index, slot)) {
      out.emplace_back(key, tensor.clone());  // "step"
      continue;
    }
    const bool elementwise = tensor.numel() == shard_.numel();
    if (!assembles) {
      // Its shard to the root, in rank order; nothing kept here.
      if (elementwise) comm_.send(tensor.reshape({shard_.numel()}).contiguous(), root);
      continue;
    }
    Tensor value = tensor.clone();
    if (elementwise) {
      value = layout_.empty_buffer();
      const Tensor shard = tensor.reshape({shard_.numel()});
      if (root < 0) {
        comm_.all_gather(shard, value);
      } else {
        // Rank r's shard is the r-th run of shard-size elements, as all_gather lays it out.
        for (int r = 0; r < comm_.size(); ++r) {
          const Tensor part = slice(value, 0, r * shard_.numel(), (r + 1) * shard_.numel());
          if (r == root) {
            part.copy_from(shard);
          } else {
            comm_.recv(part, r);
          }
        }
      }
    }
    slots.emplace_back(slot, value);
    per_element.push_back(elementwise);
  }
  if (!assembles) return {};
  // The unsharded optimizer's order: per parameter, its slots.
  for (size_t i = 0; i < layout_.params().size(); ++i) {
    for (size_t s = 0; s < slots.size(); ++s) {
      const Tensor& value = slots[s].second;
      out.emplace_back(optim::state_key(i, slots[s].first),
                       per_element[s] ? layout_.view(value, i).clone() : value.clone());
    }
  }
  return out;
}

void ShardedOptimizer::load_full_state_dict(const NamedTensors& state) {
  // Per slot, the full flat buffer (zeros for a parameter that had none), then this rank's range.
  std::map<std::string, Tensor> per_element;
  std::map<std::string, Tensor> scalars;
  NamedTensors shard_state;
  for (const auto& [key, tensor] : state) {
    size_t index = 0;
    std::string slot;
    if (!optim::parse_state_key(key, index, slot)) {
      shard_state.emplace_back(key, tensor);
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
  for (const auto& [slot, full] : per_element)
    shard_state.emplace_back("state.0." + slot, slice(full, 0, shard_begin(), shard_begin() + shard_size()).clone());
  for (const auto& [slot, value] : scalars) shard_state.emplace_back("state.0." + slot, value);
  optimizer_->load_state_dict(shard_state);
}

}  // namespace lockstep::parallel
