#include "lockstep/parallel/tensor_parallel.h"

#include "lockstep/autograd/node.h"
#include "lockstep/ops/ops.h"
#include "lockstep/parallel/shard.h"

namespace lockstep::parallel {
namespace {

// An owned, contiguous copy: the collective works in place and must not touch the caller's
// tensor (a gradient buffer the engine may share, or a view of a parameter).
Tensor reduced(const Tensor& x, comm::Communicator& group) {
  const Tensor out = x.contiguous().clone();
  group.all_reduce(out);
  return out;
}

// This rank's shard of a full layer's tensor, as a new parameter.
Tensor shard(const Tensor& t, int64_t axis, const comm::Communicator& group, const char* what, int64_t parts = 1) {
  return shard_of(t, axis, group.rank(), group.size(), what, parts).set_requires_grad(true);
}

}  // namespace

Tensor copy_to_tensor_parallel(const Tensor& x, const std::shared_ptr<comm::Communicator>& group) {
  const Tensor y = x.detach();
  autograd::record(
      "copy_to_tensor_parallel", {x}, {y},
      [group](const std::vector<Tensor>& grads) -> std::vector<Tensor> { return {reduced(grads[0], *group)}; });
  return y;
}

Tensor reduce_from_tensor_parallel(const Tensor& x, const std::shared_ptr<comm::Communicator>& group) {
  Tensor y;
  {
    NoGradGuard no_grad;
    y = reduced(x, *group);
  }
  autograd::record("reduce_from_tensor_parallel", {x}, {y},
                   [](const std::vector<Tensor>& grads) -> std::vector<Tensor> { return {grads[0]}; });
  return y;
}

ColumnParallelLinear::ColumnParallelLinear(const nn::Linear& full, std::shared_ptr<comm::Communicator> group,
                                           int64_t parts)
    : in_features(full.in_features), out_features(full.out_features / group->size()), group_(std::move(group)) {
  NoGradGuard no_grad;
  weight = register_parameter("weight", shard(full.weight, 0, *group_, "ColumnParallelLinear", parts));
  if (full.bias.defined()) {
    bias = register_parameter("bias", shard(full.bias, 0, *group_, "ColumnParallelLinear", parts));
  }
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  return linear(copy_to_tensor_parallel(x, group_), weight, bias);
}

RowParallelLinear::RowParallelLinear(const nn::Linear& full, std::shared_ptr<comm::Communicator> group)
    : in_features(full.in_features / group->size()), out_features(full.out_features), group_(std::move(group)) {
  NoGradGuard no_grad;
  weight = register_parameter("weight", shard(full.weight, 1, *group_, "RowParallelLinear"));
  if (full.bias.defined()) bias = register_parameter("bias", full.bias.clone().set_requires_grad(true));
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  LOCKSTEP_CHECK(x.size(x.dim() - 1) == in_features)
      << "RowParallelLinear: input has " << x.size(x.dim() - 1) << " features, this rank's share is " << in_features
      << " (the output of a ColumnParallelLinear with the same tensor-parallel group)";
  const Tensor partial = reduce_from_tensor_parallel(linear(x, weight), group_);
  return bias.defined() ? partial + bias : partial;
}

}  // namespace lockstep::parallel
