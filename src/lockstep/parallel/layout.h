// The one interface every parallel layout implements — DataParallel (one process, many
// devices), DistributedDataParallel and its ZeRO stages (one process per device) — so a training
// loop drives any of them alike: a step on a global batch with the user's loss (the
// layout's options carry it), the learning rate, the full model and the unsharded
// optimizer state and their loading, and the devices it drives.
#pragma once

#include <string>
#include <vector>

#include "lockstep/core/device.h"
#include "lockstep/data/tensor_batch.h"
#include "lockstep/nn/module.h"
#include "lockstep/parallel/loss_function.h"
#include "lockstep/parallel/step.h"

namespace lockstep::parallel {

class Layout {
 public:
  virtual ~Layout() = default;

  // One optimizer step on the global batch, whose first sample has global index
  // context.first_sample (random layers key their draws by it). Every process of a
  // multi-process layout passes the same global batch and trains on its share. The batch
  // must split as the step's tree needs (check_step_layout); the error says which sizes do.
  virtual StepResult step(const TensorBatch& global_batch, const StepContext& context) = 0;

  // The samples of a micro-batch, the leaf of the step's tree (0 where the layout does not
  // say).
  virtual int64_t micro_batch() const { return 0; }
  // Changes the micro-batch of the steps that follow, where the layout can: "" when done,
  // else why not. global_batch is what the next step gets, which the new micro-batch must
  // split as the step's tree needs. A layout that accepts promises that a step which threw
  // OutOfMemoryError changed no weight, gradient, statistic or optimizer state and left the
  // layout ready for the next step (one that ran out while updating throws a plain Error),
  // so a training loop may retry that step with a smaller micro-batch, as
  // train::TrainerOptions::halve_micro_batch_on_out_of_memory does. Across processes every
  // process's step throws it alike (DistributedDataParallel agrees on the failure before it
  // changes anything), and each process's loop makes the same change. A layout that cannot
  // keep the promise refuses, saying why.
  virtual std::string set_micro_batch(int64_t /*micro_batch*/, int64_t /*global_batch*/) {
    return "the layout's micro-batch is fixed when it is built";
  }

  // The whole model as one device holds it (device 0's replica; this rank's under ddp):
  // what is saved and evaluated. Collective where the parameters are sharded (ZeRO-3
  // gathers them on every rank, and they stay gathered until the next step).
  virtual nn::Module& model() = 0;
  // The same on process `root`; elsewhere nullptr where the layout would have to assemble
  // the model (a mesh's shards are sent to root alone), so no other rank holds a full copy:
  // what a checkpoint written by root needs. Collective where the model is sharded.
  virtual nn::Module* model_on(int /*root*/) { return &model(); }
  // Loads a full state_dict (parameters and buffers) into every replica this process holds.
  // Every rank calls it: collective where the ranks share one copy of the weights.
  virtual void load_model_state(const NamedTensors& state) = 0;

  virtual void set_lr(double lr) = 0;
  virtual double lr() const = 0;
  // The optimizer state as one unsharded optimizer over model()'s parameters holds it
  // (collective where the state is sharded across processes), and its loading: checkpoints
  // hold it, so they load into any layout on any number of devices.
  virtual NamedTensors optimizer_state() = 0;
  // The same assembled on process `root` only, the others getting an empty list: what a
  // checkpoint needs, without a full copy on every rank (collective where it is sharded).
  virtual NamedTensors optimizer_state_on(int /*root*/) { return optimizer_state(); }
  virtual void load_optimizer_state(const NamedTensors& state) = 0;

  // The devices this process drives.
  virtual std::vector<Device> local_devices() const = 0;

  // The largest of `value` over the processes the layout spans: a collective that every
  // process calls at the same point; within one process, the value itself. A training loop
  // agrees through it on when to save and stop (a signal reaches the ranks at different
  // steps).
  virtual int64_t max_over_processes(int64_t value) { return value; }

  // This process gives up (its own code failed outside a step: a checkpoint it could not
  // write, say): the other processes, waiting for it in their next collective, fail at once
  // with `reason`, so the job's log shows the cause rather than a peer's timeout. Within one
  // process, nothing to do.
  virtual void give_up(const std::string& /*reason*/) {}

  // Whether every replica holds the same weights and optimizer state now. Local SGD's
  // replicas drift apart between averagings: a training loop then puts a checkpoint or a
  // stop off until they agree again, and averages them at the end of the run. The same on
  // every process.
  virtual bool replicas_agree() const { return true; }
  virtual void average_replicas() {}
};

}  // namespace lockstep::parallel
