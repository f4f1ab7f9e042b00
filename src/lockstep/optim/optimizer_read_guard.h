// Optimizer offload's overlapped update is safe only where whoever reads the parameters
// waits for it. A ParameterReadGuard makes every module of a model do so (through the
// modules' parameter access hooks, nn/module.h): a module's forward waits until the
// parameters it owns have landed, while the host still updates those the later modules
// own; anything that hands out or changes the whole model (state_dict, load_state_dict,
// parameters, to) waits for all of it. Only then does it let the optimizers step in the
// background (OffloadUpdates::overlapped); a layout that cannot guard its readers makes none,
// and its optimizers step inside step().
//
// Why a module's own parameters suffice: an optimizer updates its parameters in order, so
// once parameter i has landed so has every one before it, and Lockstep's models register
// their parameters in the order forward uses them. A parameter read outside its module
// (GPT's tied head reads the embedding's weight in the root's forward) is safe when its
// module ran first; one read before its module's forward, outside it, is not waited for.
#pragma once

#include <cstddef>
#include <vector>

#include "lockstep/nn/module.h"
#include "lockstep/optim/optimizer.h"

namespace lockstep::optim {

class ParameterReadGuard {
 public:
  // models: the modules whose parameters the optimizers update (DataParallel's replicas on
  // CPU devices, which share one copy of the weights: all of them). optimizers: whose
  // parameters are those parameters or views of them (a device's share). Each optimizer
  // that asked for overlapped offload and whose every parameter lies within the models'
  // parameters steps in the background from now on; the others are left as they are. The
  // guard takes the access hooks of every module of the models (one guard per model), and
  // must be destroyed before the models and the optimizers.
  ParameterReadGuard(const std::vector<nn::Module*>& models, const std::vector<Optimizer*>& optimizers);
  // Waits for every update in flight (reporting no error), removes the hooks, and the
  // optimizers step inside step() again.
  ~ParameterReadGuard();
  ParameterReadGuard(const ParameterReadGuard&) = delete;
  ParameterReadGuard& operator=(const ParameterReadGuard&) = delete;

  // The optimizers that step in the background under this guard.
  const std::vector<Optimizer*>& overlapped() const { return overlapped_; }

 private:
  // What a module's forward waits for: the last of one optimizer's parameters that overlaps
  // the module's own parameters (with the earlier ones, by the order).
  struct Landing {
    Optimizer* optimizer;
    size_t last_index;
  };
  void wait_for_all() const;

  std::vector<nn::Module*> modules_;
  std::vector<Optimizer*> overlapped_;
};

}  // namespace lockstep::optim
