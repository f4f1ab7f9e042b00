// Activation checkpointing: y = checkpoint(fn, x) computes fn(x) without recording it, so
// none of fn's intermediate activations stay alive until backward; only x does. When the
// gradient of y arrives, fn(x) runs again with autograd on and backward goes through that
// recomputation: the parameters fn uses get their gradients there (their hooks fire there),
// and x gets its gradient as usual. Costs one more forward of fn per backward.
//
// fn must compute the same values twice: Lockstep's ops are deterministic and dropout is
// keyed by sample index, so the recomputation gives the very bits of the first run and the
// weights equal those of a run without checkpointing. When x needs no gradient (or grad
// mode is off), fn simply runs.
#pragma once

#include <functional>

#include "lockstep/core/tensor.h"

namespace lockstep::autograd {

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x);

}  // namespace lockstep::autograd
