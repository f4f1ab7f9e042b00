// DistributedDataParallel's side of a step that runs out of memory on some rank: what that
// rank still owes the others, what every rank drops once they agree the step failed, and
// when the micro-batch may change for the step to be taken again.
//
// A collective completes only once every rank has made it, so a rank that stops midway
// would leave its peers waiting in their next bucket's collective. Instead it keeps making
// the collectives of its step, in their order, on placeholder buffers: the buckets it has
// not started, then the step's agreement (step_agreement.h), which every rank makes after
// its buckets anyway, carrying the loss. All ranks learn there that the step failed, and
// nothing has changed yet: the optimizer, the running statistics and the weights change
// only after it. Unlike ending the group and meeting again through the store, this needs
// nothing of the backend, keeps backward's overlap with the buckets, and costs nothing
// when no rank fails (the agreement is the loss's own all-reduce, one element longer).
#include <algorithm>

#include "lockstep/ops/ops.h"
#include "lockstep/parallel/distributed_data_parallel.h"

namespace lockstep::parallel {

std::string DistributedDataParallel::why_micro_batch_is_fixed() const {
  if (options_.zero_stage == 3) {
    return "ZeRO-3 gathers each unit of the weights inside forward and backward, in the order the model runs them: "
           "a rank that ran out of memory midway could not make the rest of those gathers, and its peers would wait "
           "for it (ZeRO-1 and ZeRO-2 can take such a step again)";
  }
  if (local_sgd()) {
    return "local SGD's steps send nothing between the ranks, so none would learn that another ran out of memory "
           "(sync_every 1 can take such a step again)";
  }
  if (group_ended_) return "an error ended the ranks' group, so no step can be taken again";
  return "";
}

std::string DistributedDataParallel::set_micro_batch(int64_t micro_batch, int64_t global_batch) {
  if (const std::string why = why_micro_batch_is_fixed(); !why.empty()) return why;
  if (micro_batch < 1) return "the micro-batch must hold at least one sample, got " + std::to_string(micro_batch);
  const std::string error = check_step_layout(global_batch, micro_batch, comm_->size());
  if (!error.empty()) return error;
  options_.micro_batch = micro_batch;
  return "";
}

void DistributedDataParallel::abandon_step() {
  collecting_ = false;
  accumulating_.reset();
  clear_grad_destinations();
  // A gradient backward left half-accumulated, or computed and not yet taken.
  for (const Tensor& p : gradients_.params()) p.set_grad(Tensor());
  tree_.clear();
  // A collective in flight holds the tensors it reads and writes until it is done.
  bucket_buffers_.clear();
  grad_shard_ = Tensor();
  last_leaf_ = Tensor();
  // The running statistics are applied only after the agreement; what this step recorded
  // is discarded when the next one starts.
}

void DistributedDataParallel::pay_owed_collectives() {
  // ZeRO-1's reduce-scatters, local SGD's and PowerSGD's reductions all come after the
  // agreement: during backward they start nothing.
  if (options_.zero_stage == 1 || hold_buckets_) return;
  const int ranks = comm_->size();
  if (options_.zero_stage >= 2) {
    // Each bucket had a buffer of its own, made as backward reached it: one zeroed stand-in
    // of the largest bucket owed serves them all (they run one after another, and what they
    // compute is dropped).
    int64_t largest = 0;
    for (size_t b = next_bucket_; b < buckets_.size(); ++b)
      largest = std::max(largest, buckets_[b].end - buckets_[b].begin);
    if (largest == 0) return;
    const Tensor& sample = gradients_.params().front();
    const Tensor input = Tensor::zeros({largest}, sample.dtype(), sample.device());
    const Tensor output = Tensor::empty({largest / ranks}, sample.dtype(), sample.device());
    placeholders_ = {input, output};
    for (; next_bucket_ < buckets_.size(); ++next_bucket_) {
      const int64_t size = buckets_[next_bucket_].end - buckets_[next_bucket_].begin;
      works_.push_back(comm_->reduce_scatter_async(slice(input, 0, 0, size), slice(output, 0, 0, size / ranks)));
    }
    return;
  }
  // ddp reduces every step's buckets in one buffer that outlives the step (or its bf16
  // wire): the owed ranges of it are their own stand-ins.
  const Tensor& buffer = wire_.defined() ? wire_ : reduced_;
  const comm::ReduceOp op = wire_.defined() ? comm::ReduceOp::rounded_sum : comm::ReduceOp::sum;
  for (; next_bucket_ < buckets_.size(); ++next_bucket_) {
    const Tensor range = slice(buffer, 0, buckets_[next_bucket_].begin, buckets_[next_bucket_].end);
    range.zero();
    works_.push_back(comm_->all_reduce_async(range, op));
  }
}

}  // namespace lockstep::parallel
