#include "lockstep/parallel/local_ranks.h"

#include <string>

#include "lockstep/comm/local_communicator.h"

namespace lockstep::parallel {

LocalRanks::LocalRanks(int ranks, int threads_per_device) : comms_(comm::LocalCommunicator::create_group(ranks)) {
  workers_ = std::make_unique<DeviceWorkers>(ranks, threads_per_device, [this](int rank, const std::string& message) {
    comms_[static_cast<size_t>(rank)]->abort("device " + std::to_string(rank) + ": " + message);
  });
}

StepResult merge_rank_results(const std::vector<StepResult>& ranks) {
  StepResult result;
  result.loss = ranks.at(0).loss;
  for (const StepResult& rank : ranks) result.devices.push_back(rank.devices.at(0));
  return result;
}

}  // namespace lockstep::parallel
