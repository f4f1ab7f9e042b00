// Running statistics (BatchNorm's) under a layout, folded once per step in the step's tree
// order (nn/module.h, defer_step_statistics): after each micro-batch a layout takes every
// module's pending statistics as extra entries of the micro-batch's leaf, folds them with
// the gradients and the loss, adds the devices' sums in the all-reduce's order, and applies
// the global sums to every replica's modules. Models without statistics carry no entries.
#pragma once

#include <cstddef>
#include <vector>

#include "lockstep/nn/module.h"

namespace lockstep::parallel {

class StepStatistics {
 public:
  // Defers the statistics of every module of `model` (one replica); keeps pointers to its
  // modules, so the model must outlive this.
  explicit StepStatistics(nn::Module& model);

  // Every module's pending statistics since the last take, in module order (copies; the
  // modules' pending sums start again from zero).
  std::vector<Tensor> take();
  // Hands each module its part of `sums` (entries laid out as take() gives them, summed
  // over every micro-batch of the step).
  void apply(const std::vector<Tensor>& sums);
  // Drops statistics recorded outside a step (a forward the user ran between steps).
  void discard() { take(); }

 private:
  std::vector<nn::Module*> modules_;
  std::vector<size_t> counts_;  // entries per module, from the first take (fixed shapes)
  bool counted_ = false;
};

}  // namespace lockstep::parallel
