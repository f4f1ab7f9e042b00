// torchrun's error files: each worker's TORCHELASTIC_ERROR_FILE, where a failing program
// leaves its error as JSON (PyTorch's @record decorator writes {"message": {"message":
// "ValueError: ...", "extraInfo": {"py_callstack": ..., "timestamp": ...}}}; the lockstep
// command writes the same when it fails under a launcher that set the variable). The launcher
// shows the failed rank's.
#pragma once

#include <string>

namespace lockstep::tools {

inline constexpr const char* kErrorFileVariable = "TORCHELASTIC_ERROR_FILE";

struct WorkerError {
  std::string message;    // "ValueError: the batch has 7 samples, not 8"
  std::string traceback;  // Python's call stack, when there is one
};

// The error in the file at `path`; an empty message when there is none, or it is not one.
WorkerError read_error_file(const std::string& path);

// Writes `message` to the file TORCHELASTIC_ERROR_FILE names, if any, in torchrun's format.
// Never throws: the error being reported matters more than this copy of it.
void write_error_file(const std::string& message) noexcept;

}  // namespace lockstep::tools
