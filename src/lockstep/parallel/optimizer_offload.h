// Optimizer offload for any layout: a factory whose optimizers keep their state in host
// memory and step there (Optimizer::offload_to). Under ZeRO each rank's optimizer is over
// its parts, so each rank offloads only its shard of the state: ZeRO-Offload.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "lockstep/parallel/sharded_optimizer.h"

namespace lockstep::parallel {

inline OptimizerFactory offload_optimizer(OptimizerFactory make_optimizer, Device host = Device::cpu()) {
  return [make = std::move(make_optimizer), host](std::vector<Tensor> params) {
    std::unique_ptr<optim::Optimizer> optimizer = make(std::move(params));
    optimizer->offload_to(host);
    return optimizer;
  };
}

}  // namespace lockstep::parallel
