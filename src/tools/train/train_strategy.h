// How `lockstep train` drives its devices. `dp`: this process drives every device, one
// replica and worker each (parallel::DataParallel). `ddp`: this process is one rank of a
// job started by mpirun, torchrun or `lockstep run`, one device per process
// (parallel::DistributedDataParallel). `zero1`: ddp with the optimizer state sharded
// across the ranks (ZeRO stage 1); `zero2`: the reduced gradients as well (stage 2);
// `zero3`: the weights too, each block gathered when it is used (stage 3, FSDP). All
// take the same tree-shaped step, so they give the same weights.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/nn/module.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/layout.h"
#include "lockstep/parallel/loss_function.h"
#include "tools/train/device_report.h"
#include "tools/train/train_plan.h"

namespace lockstep::tools {

// A layout (parallel/layout.h) with what `lockstep train` reports about it.
class TrainStrategy {
 public:
  virtual ~TrainStrategy() = default;

  // What the Trainer steps, saves and resumes.
  virtual parallel::Layout& layout() = 0;
  // Bytes of optimizer state the first device of this process holds.
  virtual int64_t optimizer_state_bytes() const = 0;

  // The devices this process drives, and those of the whole job.
  virtual std::vector<std::string> local_devices() const = 0;
  virtual std::vector<std::string> all_devices() const = 0;
  // Where each local device allocates (for memory_stats): dp's device d is cpu:d; a ddp
  // rank's one device is its process's cpu:0.
  virtual std::vector<Device> local_allocators() const = 0;
  // Every device's totals, given this process's (collective under ddp).
  virtual std::vector<DeviceTotals> gather(const std::vector<DeviceTotals>& local) = 0;
  // Waits for every process (ddp), e.g. so none leaves before the checkpoint is written.
  virtual void barrier() {}
  // What the layout adds to the end-of-run report (a pipeline's bubble against the theory),
  // for people and for summary.json; empty for plain data parallelism.
  virtual std::string layout_report(const std::vector<DeviceTotals>& /*totals*/) const { return ""; }
  virtual nlohmann::json layout_json(const std::vector<DeviceTotals>& /*totals*/) const { return nullptr; }
  // The processes' collectives, for summary.json: backend and route (ddp); null otherwise.
  virtual nlohmann::json collectives_json() const { return nullptr; }
};

using ReplicaFactory = std::function<std::shared_ptr<nn::Module>()>;
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor> params)>;

// Every rank's totals, given this rank's (collective over comm).
std::vector<DeviceTotals> gather_device_totals(comm::Communicator& comm, const DeviceTotals& mine);

// "cpu:first" .. "cpu:first+count-1" (or cuda:...): the devices of ranks first .. first+count-1.
std::vector<std::string> device_names(DeviceType type, int first, int count);

// The mesh layout (train_mesh_strategy.cpp): a GPT on --dp x --tp x --pp devices.
std::unique_ptr<TrainStrategy> make_mesh_strategy(const TrainPlan& plan, const ReplicaFactory& make_replica,
                                                  const OptimizerFactory& make_optimizer);

// Builds the plan's layout; a process of a launched job (ddp, zero1, zero2, zero3, a mesh of processes)
// joins it here (init_process_group(plan.settings.backend)). dp and ddp train with `loss` on
// the loader's batches; the mesh trains its GPT's own loss on the text's tokens and targets.
std::unique_ptr<TrainStrategy> make_train_strategy(const TrainPlan& plan, const parallel::LossFunction& loss,
                                                   const ReplicaFactory& make_replica,
                                                   const OptimizerFactory& make_optimizer);

}  // namespace lockstep::tools
