// How a tensor-parallel rank's parameter relates to the full model's: which full tensor it
// is, and along which axis it was cut. Layouts gather their shards into full tensors to save
// a checkpoint and cut full tensors again to load one, so a checkpoint does not depend on
// the layout that wrote it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/core/tensor.h"

namespace lockstep::parallel {

struct ShardSpec {
  std::string full_name;  // the parameter's name in the unsplit model
  int64_t axis = -1;      // -1: replicated, every rank holds the whole tensor
  int64_t parts = 1;      // equal blocks along the axis, each cut on its own (q, k and v: 3)
};

// Rank `rank` of `ranks`'s shard of `full` along `axis` (a new contiguous tensor): elements
// [r·n/T, (r+1)·n/T) of each of `parts` blocks of n, side by side. An Error naming `what`
// when the blocks do not cut evenly.
Tensor shard_of(const Tensor& full, int64_t axis, int rank, int ranks, const std::string& what, int64_t parts = 1);
inline Tensor shard_of(const Tensor& full, const ShardSpec& spec, int rank, int ranks) {
  return spec.axis < 0 ? full.contiguous().clone() : shard_of(full, spec.axis, rank, ranks, spec.full_name, spec.parts);
}

// The full tensor from every rank's shard, in rank order (the inverse of shard_of); a
// replicated tensor is rank 0's.
Tensor unshard(const std::vector<Tensor>& shards, const ShardSpec& spec);

}  // namespace lockstep::parallel
