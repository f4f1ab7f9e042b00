// Tensor parallelism (Megatron-LM): a layer's weight cut across the T ranks of a
// tensor-parallel group, each rank computing its part.
//
// Two conjugate functions carry the communication, each an autograd op:
//   copy_to_tensor_parallel     forward: identity    backward: all-reduce the gradient
//   reduce_from_tensor_parallel forward: all-reduce  backward: identity
// A column-parallel Linear (output features cut) followed by a row-parallel one (input
// features cut) — an MLP, or attention cut by heads — needs one all-reduce in forward and
// one in backward. Every rank of the group must call the same ops in the same order (they
// are collectives).
//
// In a model of your own, every rank of `group` (a Communicator: threads, processes or a
// DeviceMesh's tp_group()) builds the same layers from the same full ones and runs:
//   nn::Linear full_up(512, 2048), full_down(2048, 512);     // one seed: the same on every rank
//   ColumnParallelLinear up(full_up, group);                 // x [n, 512] -> [n, 2048 / T]
//   RowParallelLinear down(full_down, group);                // [n, 2048 / T] -> [n, 512]
//   Tensor y = down(gelu(up(x)));                            // the full layer's y on every rank
// The column-parallel layer wraps its input in copy_to_tensor_parallel and the row-parallel
// one its partial products in reduce_from_tensor_parallel, so nothing else is needed; an
// elementwise function between them (relu, gelu) works on each rank's slice as it is.
// The partial products are summed in another order than one device's, so the result equals
// the unsplit layer's up to rounding, not bit for bit (tests/parallel/tensor_parallel_test.cpp
// checks such an MLP against the unsplit one on 1, 2 and 4 ranks).
#pragma once

#include <memory>

#include "lockstep/comm/communicator.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/module.h"

namespace lockstep::parallel {

Tensor copy_to_tensor_parallel(const Tensor& x, const std::shared_ptr<comm::Communicator>& group);
Tensor reduce_from_tensor_parallel(const Tensor& x, const std::shared_ptr<comm::Communicator>& group);

// y[..., out/T] = x · W_rᵀ + b_r: rank r holds rows [r·out/T, (r+1)·out/T) of the full
// weight [out, in] and that slice of the bias. Its input is the full x on every rank.
class ColumnParallelLinear : public nn::Module {
 public:
  // Rank group->rank()'s shard of `full`: every rank built from the same full layer starts
  // as that layer, so a tensor-parallel model starts with the weights of the unsplit one.
  // With `parts` > 1 the output features are that many equal blocks side by side (q, k and v
  // of attention: parts = 3), and the rank takes its shard of each block, in order.
  ColumnParallelLinear(const nn::Linear& full, std::shared_ptr<comm::Communicator> group, int64_t parts = 1);
  Tensor forward(const Tensor& x) override;

  const int64_t in_features, out_features;  // out_features: this rank's share
  Tensor weight, bias;                      // [out/T, in], [out/T] (bias optional)

 private:
  std::shared_ptr<comm::Communicator> group_;
};

// y[..., out] = Σ_r x_r · W_rᵀ + b: rank r holds columns [r·in/T, (r+1)·in/T) of the full
// weight and takes that slice of the input features (a column-parallel layer's output);
// the partial products are all-reduced, then the (whole) bias is added once.
class RowParallelLinear : public nn::Module {
 public:
  RowParallelLinear(const nn::Linear& full, std::shared_ptr<comm::Communicator> group);
  Tensor forward(const Tensor& x) override;

  const int64_t in_features, out_features;  // in_features: this rank's share
  Tensor weight, bias;                      // [out, in/T], [out] (bias optional)

 private:
  std::shared_ptr<comm::Communicator> group_;
};

}  // namespace lockstep::parallel
