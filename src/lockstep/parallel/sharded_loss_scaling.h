// f16 under ZeRO: each rank holds only its shard of the reduced gradients, so the loss scaler
// (optim/loss_scaler.h) unscales that shard and the ranks agree, with one all-reduce of a flag,
// whether every shard is finite: all step or all skip, and every rank's scaler changes alike.
// Unscaling divides each element by the same power of two wherever it lies, so a step has the
// bits of the unsharded one.
#pragma once

#include "lockstep/comm/communicator.h"
#include "lockstep/optim/loss_scaler.h"
#include "lockstep/parallel/sharded_optimizer.h"

namespace lockstep::parallel {

// The gate for ShardedOptimizer's step: collective over comm. *skipped (if given) says
// whether the last step was skipped. scaler and comm must outlive it.
UpdateGate loss_scaled_gate(optim::LossScaler& scaler, comm::Communicator& comm, bool* skipped = nullptr);

}  // namespace lockstep::parallel
