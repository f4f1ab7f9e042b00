// What a pipeline stage sends and receives in a step, for GptMeshRank and
// SequentialPipelineRank alike: sends go asynchronously and their tensors stay alive until
// sent (those done are dropped as the step goes, so a 1F1B stage does not keep every
// activation), and the time a stage spends blocked in a receive, or waiting for its last
// sends, is its pipeline bubble.
#pragma once

#include <deque>
#include <utility>

#include "lockstep/comm/communicator.h"
#include "lockstep/parallel/step.h"

namespace lockstep::parallel {

class StageLinks {
 public:
  StageLinks(comm::Communicator& pipeline, DeviceTimes& times) : pipeline_(pipeline), times_(times) {}
  void send(const Tensor& tensor, int peer, int tag);
  void recv(const Tensor& buffer, int peer, int tag);
  // Waits for every send of the step.
  void finish();

 private:
  comm::Communicator& pipeline_;
  DeviceTimes& times_;
  std::deque<std::pair<comm::Work, Tensor>> sends_;
};

}  // namespace lockstep::parallel
