// What `lockstep train` keeps in a checkpoint beside the Trainer's own keys (step, data
// position, seed, batch size): the settings the run cannot change and stay exact — the
// model and its resolved shape, the optimizer and its hyper-parameters, the schedule and the
// run's length as given, the micro-batch, the precision, the data — so --resume needs no
// other flags and refuses a flag that contradicts the run it continues.
#pragma once

#include <functional>
#include <string>

#include "lockstep/io/safetensors.h"
#include "tools/train/train_options.h"

namespace lockstep::tools {

// The recipe of a run with these (resolved) settings.
Metadata train_recipe(const TrainOptions& options);

// Takes the recipe into options: from the checkpoint where the flag was not given, checked
// to agree where it was (except --data). Rejects a file that is not a Lockstep training
// checkpoint of this version.
void apply_checkpoint_settings(const Metadata& checkpoint, const std::string& path, TrainOptions& options,
                               const std::function<bool(const std::string&)>& given);

}  // namespace lockstep::tools
