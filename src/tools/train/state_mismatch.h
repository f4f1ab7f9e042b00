// What keeps a weights file from loading into a model, in one line for the command's error:
// the names the model misses, the names it does not have, and the tensors of another
// shape, a few of each named, with the counts. (nn::Module::load_state_dict's own error
// keeps PyTorch's report, a line per key, for programs.)
#pragma once

#include <string>

#include "lockstep/nn/named_tensors.h"

namespace lockstep::tools {

// "4 missing (conv1.weight, conv1.bias, conv2.weight, ...), 2 not in the model (fc3.weight,
// fc3.bias), 4 of another shape (fc1.weight [512, 784] in the file, [128, 1600] here, ...)";
// empty when names and shapes all agree.
std::string describe_state_mismatch(const NamedTensors& file, const NamedTensors& model);

}  // namespace lockstep::tools
