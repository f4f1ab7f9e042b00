// What `lockstep train` keeps in a checkpoint beside the Trainer's own keys (step, data
// position, seed, batch size): the settings the run cannot change and stay exact — the
// model and its resolved shape, the optimizer, the micro-batch — so --resume needs no
// other flags and refuses a checkpoint that belongs to another run.
#pragma once

#include <functional>
#include <string>

#include "lockstep/io/safetensors.h"
#include "tools/train/train_options.h"

namespace lockstep::tools {

// The recipe of a run with these (resolved) settings.
Metadata train_recipe(const TrainOptions& options);

// Takes the settings the checkpoint fixes (model, seed, batch size, micro-batch, optimizer,
// a GPT's shape) into options: from the checkpoint where the flag was not given, checked to
// agree where it was. Rejects a file that is not a Lockstep training checkpoint.
void apply_checkpoint_settings(const Metadata& checkpoint, const std::string& path, TrainOptions& options,
                               const std::function<bool(const std::string&)>& given);

}  // namespace lockstep::tools
