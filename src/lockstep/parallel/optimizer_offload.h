// Optimizer offload for any layout: a factory whose optimizers keep their state in host
// memory and step there (Optimizer::offload_to). Under ZeRO each rank's optimizer is over
// its parts, so each rank offloads only its shard of the state: ZeRO-Offload.
//
// Overlapped (the default), the host's update runs in the background during the next
// forward in the layouts that make their readers wait for it (optim/optimizer_read_guard.h):
// DistributedDataParallel whose ranks keep their own weights and an unsharded optimizer (GPU
// ranks over nccl, MPI ranks, share_weights = false, local SGD), and DataParallel on CPU
// devices or on one GPU. The others (ZeRO 1-3, ddp ranks that share one copy of the
// weights, DataParallel on several GPUs, which copy each other's updated shares within the
// step) step inside the step, as synchronous does everywhere. The bits are the same.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "lockstep/parallel/sharded_optimizer.h"

namespace lockstep::parallel {

inline OptimizerFactory offload_optimizer(OptimizerFactory make_optimizer, Device host = Device::cpu(),
                                          optim::OffloadUpdates updates = optim::OffloadUpdates::overlapped) {
  return [make = std::move(make_optimizer), host, updates](std::vector<Tensor> params) {
    std::unique_ptr<optim::Optimizer> optimizer = make(std::move(params));
    optimizer->offload_to(host, updates);
    return optimizer;
  };
}

}  // namespace lockstep::parallel
