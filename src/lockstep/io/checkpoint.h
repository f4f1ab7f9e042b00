// Checkpoints: named tensors plus string metadata in one safetensors file, saved atomically
// (temporary file, fsync, rename, fsync of the directory) so a crash or a full disk during
// a save leaves the previous checkpoint intact, and with a SHA-256 of its tensors in the
// metadata, checked on load, so a file damaged later is an error and not a wrong resume.
// `train::Trainer` stores "model.<param>" weights, "optim.<...>" state, and step / epoch /
// data position as metadata.
#pragma once

#include <functional>
#include <string>

#include "lockstep/io/safetensors.h"

namespace lockstep {

using Checkpoint = TensorFile;

// Saves atomically over `path` (replacing any previous checkpoint there). The metadata
// may not use the key kTensorsSha256Key, which holds the tensors' hash.
void save_checkpoint(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});
// Loads and checks the tensors against the recorded hash (a file without one, written by
// another program, loads unchecked); the hash is not part of the returned metadata. An
// Error names the file when it is truncated, malformed or its tensors changed.
Checkpoint load_checkpoint(const std::string& path);

inline constexpr const char* kTensorsSha256Key = "tensors_sha256";
// SHA-256 over each tensor's name, dtype, shape and bytes, in order.
std::string tensors_sha256(const NamedTensors& tensors);

// The atomic-replace protocol behind save_checkpoint, for any file: write(temp_path) fills
// `<path>.tmp.<pid>`, which is then fsynced and renamed over path, and the directory
// fsynced. If write throws or any step fails, the temporary file is removed, path is left as
// it was, and the error propagates.
void write_file_atomically(const std::string& path, const std::function<void(const std::string& temp_path)>& write);

}  // namespace lockstep
