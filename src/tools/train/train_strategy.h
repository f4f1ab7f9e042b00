// How `lockstep train` drives its devices. `dp`: this process drives every device, one
// replica and worker each (parallel::DataParallel). `ddp`: this process is one rank of a
// job started by mpirun, torchrun or `lockstep run`, one device per process
// (parallel::DistributedDataParallel). `zero1`: ddp with the optimizer state sharded
// across the ranks (ZeRO stage 1). All take the same tree-shaped step, so they give the
// same weights.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/data/dataloader.h"
#include "lockstep/io/checkpoint.h"
#include "lockstep/nn/module.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/loss_function.h"
#include "lockstep/parallel/step.h"
#include "tools/train/device_report.h"
#include "tools/train/train_checkpoint.h"
#include "tools/train/train_options.h"

namespace lockstep::tools {

class TrainStrategy {
 public:
  virtual ~TrainStrategy() = default;

  // One optimizer step on the global batch (every process loads the same batches; a ddp
  // rank trains on its share).
  virtual parallel::StepResult step(const Batch& batch, uint64_t step, uint64_t seed) = 0;
  // The replica that is saved and evaluated (device 0's; under ddp this rank's).
  virtual nn::Module& model() = 0;
  virtual void set_lr(double lr) = 0;
  virtual double lr() const = 0;
  // The optimizer state, unsharded (collective under zero1).
  virtual NamedTensors optimizer_state() = 0;
  // Bytes of optimizer state the first device of this process holds.
  virtual int64_t optimizer_state_bytes() const = 0;
  // Loads the checkpoint into every replica this process holds; returns where it stopped.
  virtual RunPosition restore(const Checkpoint& checkpoint, const std::string& path) = 0;

  // The devices this process drives, and those of the whole job.
  virtual std::vector<std::string> local_devices() const = 0;
  virtual std::vector<std::string> all_devices() const = 0;
  // Where each local device allocates (for memory_stats): dp's device d is cpu:d; a ddp
  // rank's one device is its process's cpu:0.
  virtual std::vector<Device> local_allocators() const = 0;
  virtual int threads_per_device() const = 0;
  // Every thread this process computes with (dp: all its devices').
  virtual int process_threads() const = 0;
  // Whether this process writes the run's files and prints its results (ddp: rank 0).
  virtual bool leader() const = 0;
  // Every device's totals, given this process's (collective under ddp).
  virtual std::vector<DeviceTotals> gather(const std::vector<DeviceTotals>& local) = 0;
  // Waits for every process (ddp), e.g. so none leaves before the checkpoint is written.
  virtual void barrier() {}
  // What the layout adds to the end-of-run report (a pipeline's bubble against the theory),
  // for people and for summary.json; empty for plain data parallelism.
  virtual std::string layout_report(const std::vector<DeviceTotals>& /*totals*/) const { return ""; }
  virtual nlohmann::json layout_json(const std::vector<DeviceTotals>& /*totals*/) const { return nullptr; }
};

using ReplicaFactory = std::function<std::shared_ptr<nn::Module>()>;
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor> params)>;

// Every rank's totals, given this rank's (collective over comm).
std::vector<DeviceTotals> gather_device_totals(comm::Communicator& comm, const DeviceTotals& mine);

// The threads this process computes with: --threads, else the host's cores shared by the
// processes of the job on this host.
int threads_for_process(const TrainOptions& options, int processes_on_host);

// "cpu:first" .. "cpu:first+count-1".
std::vector<std::string> cpu_device_names(int first, int count);

// The mesh layout (train_mesh_strategy.cpp): a GPT on --dp x --tp x --pp devices driven by
// this process.
std::unique_ptr<TrainStrategy> make_mesh_strategy(TrainOptions& options, const ReplicaFactory& make_replica,
                                                  const OptimizerFactory& make_optimizer);

// Joins the job under ddp (init_process_group(options.backend)); settles options.devices
// (default: one per core under dp, lowered to what can share the step; the world size
// under ddp) and checks it against the step's layout. dp and ddp train with `loss` on the
// loader's batches; the mesh trains its GPT's own loss on the text's tokens and targets.
std::unique_ptr<TrainStrategy> make_train_strategy(TrainOptions& options, const parallel::LossFunction& loss,
                                                   const ReplicaFactory& make_replica,
                                                   const OptimizerFactory& make_optimizer);

}  // namespace lockstep::tools
