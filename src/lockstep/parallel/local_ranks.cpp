#include "lockstep/parallel/local_ranks.h"

#include <string>

#include "lockstep/comm/device_group.h"

namespace lockstep::parallel {

LocalRanks::LocalRanks(const std::vector<Device>& devices, int threads_per_device) : devices_(devices) {
  LOCKSTEP_CHECK(!devices.empty()) << "a group of ranks needs at least one device";
  const int ranks = static_cast<int>(devices.size());
  workers_ = std::make_unique<DeviceWorkers>(ranks, threads_per_device, [this](int rank, const std::string& message) {
    // Empty while the group is being made: a rank that fails to join stops the others at
    // their rendezvous's timeout.
    const auto at = static_cast<size_t>(rank);
    if (at < comms_.size() && comms_[at])
      comms_[at]->abort("rank " + std::to_string(rank) + " on " + devices_[at].str() + ": " + message);
  });
  comms_ = comm::create_device_group(devices, [this](const std::function<void(int)>& task) { workers_->run(task); });
}

std::vector<Device> first_devices(DeviceType type, int count) {
  std::vector<Device> devices;
  for (int d = 0; d < count; ++d) devices.emplace_back(type, d);
  return devices;
}

StepResult merge_rank_results(const std::vector<StepResult>& ranks) {
  StepResult result;
  result.loss = ranks.at(0).loss;
  for (const StepResult& rank : ranks) result.devices.push_back(rank.devices.at(0));
  return result;
}

}  // namespace lockstep::parallel
