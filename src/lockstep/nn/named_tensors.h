// An ordered list of (name, tensor): what state_dict() returns and what checkpoints store.
// Order is part of the contract (it is PyTorch's state_dict order), so this is a vector, not
// a map.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "lockstep/core/tensor.h"

namespace lockstep {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

}  // namespace lockstep
