#include "lockstep/parallel/stage_links.h"

namespace lockstep::parallel {

void StageLinks::send(const Tensor& tensor, int peer, int tag) {
  while (!sends_.empty() && sends_.front().first.done()) sends_.pop_front();
  const Tensor alive = tensor.contiguous();
  sends_.emplace_back(pipeline_.send_async(alive, peer, tag), alive);
}

void StageLinks::recv(const Tensor& buffer, int peer, int tag) {
  const StepClock::time_point start = StepClock::now();
  pipeline_.recv(buffer, peer, tag);
  times_.bubble += seconds_since(start);
}

void StageLinks::finish() {
  if (sends_.empty()) return;
  const StepClock::time_point start = StepClock::now();
  for (const auto& [work, tensor] : sends_) work.wait();
  sends_.clear();
  times_.bubble += seconds_since(start);
}

}  // namespace lockstep::parallel
