// Checkpoints: named tensors plus string metadata in one safetensors file, saved atomically
// (temporary file, fsync, rename, fsync of the directory) so a crash or a full disk during
// a save leaves the previous checkpoint intact. `train` stores "model.<param>" weights,
// "optim.<...>" state, and step / epoch / data position / RNG state as metadata.
#pragma once

#include <functional>
#include <string>

#include "lockstep/io/safetensors.h"

namespace lockstep {

using Checkpoint = TensorFile;

// Saves atomically over `path` (replacing any previous checkpoint there).
void save_checkpoint(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});
Checkpoint load_checkpoint(const std::string& path);

// The atomic-replace protocol behind save_checkpoint, for any file: write(temp_path) fills
// `<path>.tmp.<pid>`, which is then fsynced and renamed over path, and the directory
// fsynced. If write throws or any step fails, the temporary file is removed, path is left as
// it was, and the error propagates.
void write_file_atomically(const std::string& path, const std::function<void(const std::string& temp_path)>& write);

}  // namespace lockstep
