// ZeRO-3's parameters: each rank keeps only its part of every unit of the flat buffer
// (sharded_optimizer.h's parts, which its optimizer steps in place); a unit's full values
// exist only while gathered. Each unit has its own bytes, gathered from every rank's part
// (an all-gather: an exact copy) just before the unit is used and released right after,
// while the parameters stay views of them: handles to the parameters, and the views
// autograd saved of them, stay valid across a release (Storage::release_bytes) and see the
// values again after the next gather.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/comm/work.h"
#include "lockstep/parallel/flat_gradients.h"

namespace lockstep::parallel {

class ShardedWeights {
 public:
  // layout: the parameters, built with shards = comm.size(), the same values on every rank.
  // They move into their units' bytes (Tensor::set_data); every unit starts released.
  ShardedWeights(const FlatGradients& layout, comm::Communicator& comm);
  ~ShardedWeights();
  ShardedWeights(const ShardedWeights&) = delete;
  ShardedWeights& operator=(const ShardedWeights&) = delete;

  // This rank's part of each unit: what the optimizer steps.
  const std::vector<Tensor>& parts() const { return parts_; }
  // Starts gathering unit u unless it is gathered or being gathered (collective: every rank
  // starts the same units in the same order).
  void prefetch(size_t u);
  // Returns once unit u's full values are in place.
  void gather(size_t u);
  // Frees unit u's full values (waiting for a gather in flight).
  void release(size_t u);
  bool held(size_t u) const { return !full_[u].storage()->released(); }
  void gather_all();
  void release_all();
  // Waits for every gather in flight, ignoring their errors, and releases every unit: what
  // is left after a failed step.
  void abandon();
  // Loads new full values: gives every unit bytes, runs write (which fills the parameters,
  // e.g. Module::load_state_dict), keeps this rank's parts of them and releases all. Not
  // collective: every rank writes the same values.
  void write_all(const std::function<void()>& write);

 private:
  const FlatGradients& layout_;
  comm::Communicator& comm_;
  std::vector<Tensor> full_;                          // per unit, its values and padding (released between uses)
  std::vector<Tensor> parts_;                         // per unit, this rank's part
  std::vector<std::optional<comm::Work>> gathering_;  // per unit, its all-gather in flight
};

}  // namespace lockstep::parallel
