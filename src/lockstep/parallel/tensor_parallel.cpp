#include "lockstep/parallel/tensor_parallel.h"

#include "lockstep/autograd/node.h"
#include "lockstep/ops/ops.h"

namespace lockstep::parallel {
namespace {

// An owned, contiguous copy: the collective works in place and must not touch the caller's
// tensor (a gradient buffer the engine may share, or a view of a parameter).
Tensor reduced(const Tensor& x, comm::Communicator& group) {
  const Tensor out = x.contiguous().clone();
  group.all_reduce(out);
  return out;
}

// Rows (axis 0) or columns (axis 1) [r·n/T, (r+1)·n/T) of `t`, as a new parameter; with
// `parts` > 1, that shard of each of `parts` equal blocks along the axis, concatenated.
Tensor shard(const Tensor& t, int64_t axis, const comm::Communicator& group, const char* what, int64_t parts = 1) {
  const int64_t n = t.size(axis) / parts, ranks = group.size();
  LOCKSTEP_CHECK(n * parts == t.size(axis) && n % ranks == 0)
      << what << ": " << n << " features do not cut into " << ranks
      << " equal tensor-parallel shards; use a tensor-parallel size that divides " << n;
  const int64_t size = n / ranks;
  std::vector<Tensor> pieces;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t begin = p * n + size * group.rank();
    pieces.push_back(slice(t, axis, begin, begin + size));
  }
  Tensor piece = (parts == 1 ? pieces[0] : concat(pieces, axis)).contiguous().clone();
  return piece.set_requires_grad(true);
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
