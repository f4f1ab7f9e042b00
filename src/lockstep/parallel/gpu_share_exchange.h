// What DataParallel's GPU devices exchange in a step, device to device with no trip through
// the host: each device's subtree sums, of which every device folds its share (and the
// whole of the loss and of the running statistics), and the shares each device's optimizer
// updated, which every device copies into its own replica (ZeRO-1's all-gather). A device
// reads another's memory where it lies when its GPU can (the same GPU, or peer access),
// else through a peer copy of what it needs.
//
// The host threads' barrier says only that the work before it is queued; each device's
// stream runs on its own. So each exchange is a pair of calls around that barrier: before
// it, device d marks its stream (sums_queued, updates_queued); after it, d's stream waits
// for every other device's mark (wait_for_sums, wait_for_updates) before it reads what they
// wrote. The second wait also orders d's later work after every other device's fold, the
// last reader of d's sums: the caching allocator hands a block out again to its own
// device's later work only, so d's sums may be released once d has queued that wait.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "lockstep/core/tensor.h"

namespace lockstep::parallel {

class GpuShareExchange {
 public:
  // For devices cuda:0 .. cuda:devices-1 (at most 64: one fold reads them all); turns on
  // peer access between their GPUs where the topology allows.
  explicit GpuShareExchange(int devices);
  ~GpuShareExchange();
  GpuShareExchange(const GpuShareExchange&) = delete;
  GpuShareExchange& operator=(const GpuShareExchange&) = delete;

  // Device d, once the work computing its sums is queued and before the host barrier.
  void sums_queued(int device);
  // Device d, after that barrier: what d queues next runs after every device's sums.
  void wait_for_sums(int device);

  // Device d, after wait_for_sums: out = the tree fold (comm/tree_reduce.h: the order and
  // the bits of the CPU devices' fold and of the nccl backend's) over every device e of the
  // elements [begin, begin + out.numel()) of sums[e][index], where sums[e] are device e's
  // contiguous sums on cuda:e. out is contiguous, on cuda:d, of the sums' dtype; it may be
  // those very elements of d's own sum (d's share, which no other device reads).
  void fold(int device, const std::vector<std::vector<Tensor>>& sums, size_t index, int64_t begin,
            const Tensor& out) const;

  // Device d, once its optimizer's update is queued and before the host barrier.
  void updates_queued(int device);
  // Device d, after that barrier: what d queues next runs after every device's update
  // (and after every other device's reads of d's sums).
  void wait_for_updates(int device);

  // Elements [begin, begin + count) of `from` into the same elements of `to` (contiguous
  // tensors of one shape and dtype on two GPU devices), queued on to's device's stream.
  void copy_elements(const Tensor& from, const Tensor& to, int64_t begin, int64_t count) const;

  // Waits until every device's stream has run what was queued on it, ignoring CUDA errors
  // (there is a first error already): after a failed step, before its sums are released,
  // since another device's stream may still be reading them.
  void drain() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lockstep::parallel
