// The ranks of a data-parallel step agree, before any of them changes state, whether every
// one of them finished its share: one all-reduce of [loss, failed] that takes the place of
// the loss's own all-reduce, so a step that fails nowhere costs nothing more. A rank whose
// share ran out of memory still joins it (after the collectives it owed the others, with
// placeholder data: distributed_data_parallel.h), so every rank learns of the failure at
// the same call and can drop the step and take it again, as the others do. Only when some
// rank failed do two broadcasts more carry the first failed rank's error to every rank.
#pragma once

#include <string>

#include "lockstep/comm/communicator.h"
#include "lockstep/core/tensor.h"

namespace lockstep::parallel {

struct AgreedStep {
  // The ranks' losses summed in the all-reduce's order (the bits loss's own all-reduce
  // gives); 0 when a rank failed.
  double loss = 0;
  // "" when every rank finished its share; else the lowest failed rank's error, named, with
  // how many others failed: "rank 1 (and 2 other ranks): out of memory on cpu:1 ...". The
  // same text on every rank.
  std::string failure;
};

// Collective: every rank calls it once per step, at the same point of its calls. loss: this
// rank's one-element f64 loss, on the device its collectives read (undefined where the rank
// failed); failure: this rank's error, "" when it finished its share.
AgreedStep agree_on_step(comm::Communicator& comm, const Tensor& loss, const std::string& failure, Device device);

}  // namespace lockstep::parallel
