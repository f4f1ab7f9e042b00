// Writes a run's checkpoints on a thread of its own, one at a time, so the steps go on while
// the bytes go to disk: at a step boundary the state is only copied to host memory, into
// buffers the writer keeps from one checkpoint to the next (no fresh pages to fault in;
// page-locked for a GPU's tensors), and the thread writes the copy.
#pragma once

#include <cstdint>
#include <future>

#include "lockstep/train/checkpoint_folder.h"

namespace lockstep::train {

class CheckpointWriter {
 public:
  explicit CheckpointWriter(CheckpointFolder folder);
  // Waits for the write in flight; a failure then can only be reported on stderr.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Waits for the write before (rethrowing its error), copies the tensors (any device) to
  // its host buffers, and starts writing them; the caller may change the originals as soon
  // as this returns.
  void write(int64_t step, const NamedTensors& tensors, Metadata metadata);
  // Waits for the write in flight, rethrowing its error.
  void wait();

  const CheckpointFolder& folder() const { return folder_; }
  int64_t writes() const { return writes_; }           // finished
  double seconds_writing() const { return seconds_; }  // their total time on the writer's thread

 private:
  CheckpointFolder folder_;
  NamedTensors copies_;  // the host buffers, reused while names, shapes and dtypes stay
  std::future<double> in_flight_;
  int64_t writes_ = 0;
  double seconds_ = 0;
};

}  // namespace lockstep::train
