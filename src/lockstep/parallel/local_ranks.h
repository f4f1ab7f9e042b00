// The ranks of a group run as threads of this process, one per device, each on its own
// long-lived worker (device_workers.h), over the group comm/device_group.h makes for the
// devices (`nccl` when each is a GPU of its own, else `local`): what PipelineParallel and
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
  // Rank r on devices[r].
  LocalRanks(const std::vector<Device>& devices, int threads_per_device);

  // task(r) on every rank's worker at once (collectives between them meet); rethrows the
  // first error.
  void run(const std::function<void(int rank)>& task) { workers_->run(task); }
  int size() const { return static_cast<int>(comms_.size()); }
  const std::shared_ptr<comm::Communicator>& comm(int rank) const { return comms_.at(static_cast<size_t>(rank)); }
  Device device(int rank) const { return devices_.at(static_cast<size_t>(rank)); }
  const std::vector<Device>& devices() const { return devices_; }

 private:
  std::vector<Device> devices_;
  std::vector<std::shared_ptr<comm::Communicator>> comms_;
  std::unique_ptr<DeviceWorkers> workers_;
};

// cpu:0 .. cpu:count-1, or the same of `type`: the devices of ranks that have one each.
std::vector<Device> first_devices(DeviceType type, int count);

// One step of several ranks as one StepResult: the loss (the same on every rank) and every
// rank's times, in rank order.
StepResult merge_rank_results(const std::vector<StepResult>& ranks);

}  // namespace lockstep::parallel
