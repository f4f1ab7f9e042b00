// The ranks of a group run as threads of this process, one per CPU device, each on its own
// long-lived worker (device_workers.h) over a `local` communicator: what PipelineParallel and
// GptMeshParallel drive their ranks with. A rank whose task throws aborts its communicator, so
// the others stop waiting for it, and the error names it.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/parallel/device_workers.h"
#include "lockstep/parallel/step.h"

namespace lockstep::parallel {

class LocalRanks {
 public:
  LocalRanks(int ranks, int threads_per_device);

  // task(r) on every rank's worker at once (collectives between them meet); rethrows the
  // first error.
  void run(const std::function<void(int rank)>& task) { workers_->run(task); }
  int size() const { return static_cast<int>(comms_.size()); }
  const std::shared_ptr<comm::Communicator>& comm(int rank) const { return comms_.at(static_cast<size_t>(rank)); }

 private:
  std::vector<std::shared_ptr<comm::Communicator>> comms_;
  std::unique_ptr<DeviceWorkers> workers_;
};

// One step of several ranks as one StepResult: the loss (the same on every rank) and every
// rank's times, in rank order.
StepResult merge_rank_results(const std::vector<StepResult>& ranks);

}  // namespace lockstep::parallel
