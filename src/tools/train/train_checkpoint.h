// The checkpoint of a training run: model weights ("model.<param>"), optimizer state
// ("optim.<...>"), and in the metadata the step, the data position, and the settings the
// data order and random draws depend on (model, seed, batch size), so --resume continues
// bit-exactly and refuses a checkpoint that belongs to another run.
#pragma once

#include <functional>
#include <string>

#include "lockstep/data/dataloader.h"
#include "lockstep/io/checkpoint.h"
#include "lockstep/nn/module.h"
#include "lockstep/optim/optimizer.h"
#include "tools/train/train_options.h"

namespace lockstep::tools {

struct RunPosition {
  int64_t step = 0;
  LoaderPosition data;
};

inline constexpr const char* kCheckpointFile = "checkpoint.safetensors";

// optimizer_state: as one unsharded optimizer over the model's parameters holds it, so the
// checkpoint loads on any number of devices, sharded or not.
void save_train_checkpoint(const std::string& path, const TrainOptions& options, const nn::Module& model,
                           const NamedTensors& optimizer_state, const RunPosition& position);

// Takes the settings the checkpoint fixes (model, seed, batch size, micro-batch, optimizer) into
// options: from the checkpoint when the flag was not given, checked to agree when it was.
// Also rejects a file that is not a Lockstep training checkpoint.
void apply_checkpoint_settings(const Checkpoint& checkpoint, const std::string& path, TrainOptions& options,
                               const std::function<bool(const std::string&)>& given);

// Loads the weights into the (already built) model, hands the optimizer state to
// load_optimizer, and returns where the run stood.
RunPosition restore_train_checkpoint(const Checkpoint& checkpoint, const std::string& path, nn::Module& model,
                                     const std::function<void(const NamedTensors&)>& load_optimizer);

}  // namespace lockstep::tools
