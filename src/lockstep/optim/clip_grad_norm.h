// Gradient clipping by total L2 norm, as torch.nn.utils.clip_grad_norm_. The norm is summed
// in double in a fixed order (parameter by parameter, fixed-size chunks), so it does not
// depend on the thread count.
#pragma once

#include <vector>

#include "lockstep/core/tensor.h"

namespace lockstep::optim {

// The L2 norm of all gradients together (parameters without a gradient are skipped).
double grad_norm(const std::vector<Tensor>& params);

// Returns the total norm before clipping; when it exceeds max_norm, multiplies every
// gradient by max_norm / (norm + 1e-6). A NaN or infinite norm is an Error when
// error_if_nonfinite, else the gradients are scaled by the (NaN) factor as PyTorch does.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, bool error_if_nonfinite = false);

}  // namespace lockstep::optim
