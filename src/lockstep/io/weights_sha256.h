// A model's fingerprint: SHA-256 over its state_dict (parameters and buffers, in PyTorch's
// order) as raw little-endian bytes. Equal hashes mean bit-identical weights, which is how a
// run shows that its result does not depend on the device count.
#pragma once

#include <string>

#include "lockstep/nn/module.h"

namespace lockstep {

std::string weights_sha256(const nn::Module& model);

}  // namespace lockstep
