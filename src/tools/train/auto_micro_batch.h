// `lockstep train --micro-batch auto`: the largest micro-batch that `lockstep plan` predicts
// fits this run's layout (strategy, devices, mesh, ZeRO stage, schedule, checkpointing,
// precision) on its devices. The micro-batch is a leaf size of the step's tree, part of
// what the result depends on, so the choice is printed with the flag that repeats it.
#pragma once

#include <cstdint>
#include <string>

#include "tools/plan/layout_prediction.h"
#include "tools/train/train_plan.h"

namespace lockstep::tools {

struct MicroBatchChoice {
  int64_t micro_batch = 0;
  double predicted_bytes = 0;  // the largest device's predicted peak at that micro-batch
  double device_bytes = 0;     // what each device has
};

// plan: made with any micro-batch that divides; its layout is kept. A UsageError when not
// even one sample per micro-batch fits, with what it needs.
MicroBatchChoice choose_micro_batch(const TrainPlan& plan, const ModelFacts& model, const MachineProfile& machine);

// The facts and the machine for this run: the model measured here, and this host's CPU
// devices, or its GPUs as NVML reads them (this_host_gpu_profile: the smallest GPU's
// memory, or LOCKSTEP_CUDA_DEVICE_MEMORY's cap). Jobs across hosts (each would choose for
// its own memory), and GPUs NVML cannot list, are UsageErrors that say to give a number.
MicroBatchChoice choose_micro_batch_here(const TrainPlan& plan, const TrainEnvironment& environment);

// "micro-batch auto: 32, the largest predicted to fit (...)".
std::string describe(const MicroBatchChoice& choice);

}  // namespace lockstep::tools
