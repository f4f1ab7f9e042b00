#include "lockstep/comm/hierarchical_communicator.h"

#include <bit>

#include "lockstep/comm/slices.h"

namespace lockstep::comm {
namespace {

// Elements [slice.begin, slice.begin + slice.size) of a contiguous tensor, as a flat view.
Tensor view_of(const Tensor& tensor, const Slice& slice) {
  return tensor.as_strided({slice.size}, {1}, tensor.offset() + slice.begin);
}

template <typename T>
void divide(const Tensor& tensor, int n) {
  T* data = tensor.data_ptr<T>();
  const T divisor = static_cast<T>(n);
  for (int64_t i = 0; i < tensor.numel(); ++i) data[i] /= divisor;
}

}  // namespace

HierarchicalCommunicator::HierarchicalCommunicator(std::shared_ptr<Communicator> flat,
                                                   std::shared_ptr<Communicator> local,
                                                   std::shared_ptr<Communicator> cross)
    : Communicator(flat->rank(), flat->size()),
      flat_(std::move(flat)),
      local_(std::move(local)),
      cross_(std::move(cross)) {
  const int per_host = local_->size();
  LOCKSTEP_CHECK(per_host * cross_->size() == size() && local_->rank() == rank() % per_host &&
                 cross_->rank() == rank() / per_host)
      << "a hierarchical group needs hosts of consecutive ranks: rank " << rank() << " of " << size() << " is rank "
      << local_->rank() << " of " << per_host << " on its host and rank " << cross_->rank() << " of " << cross_->size()
      << " across hosts";
  LOCKSTEP_CHECK(std::has_single_bit(static_cast<unsigned>(per_host)) || cross_->size() == 1)
      << "a hierarchical group needs a power of two ranks per host (its partial sums are then nodes of the "
         "rank-ordered tree), got "
      << per_host;
  set_timeout(flat_->timeout());
}

HierarchicalCommunicator::~HierarchicalCommunicator() { stop_worker(); }

std::string HierarchicalCommunicator::route() const {
  return std::to_string(hosts()) + " hosts x " + std::to_string(ranks_per_host()) + " ranks: " + local_->backend() +
         " within a host, " + cross_->backend() + " across";
}

Tensor HierarchicalCommunicator::empty_shared(const Shape& shape, DType dtype, Device device) {
  return local_->empty_shared(shape, dtype, device);
}

void HierarchicalCommunicator::abort_peers(const std::string& reason) {
  local_->abort(reason);
  cross_->abort(reason);
  flat_->abort(reason);
}

void HierarchicalCommunicator::reduce_by_host(const Tensor& tensor, ReduceOp op, bool average) {
  const Tensor flat_tensor = tensor.as_strided({tensor.numel()}, {1}, tensor.offset());
  const int per_host = local_->size();
  const size_t element = dtype_size(tensor.dtype());
  local_->all_reduce(flat_tensor, op);
  const Tensor mine = view_of(flat_tensor, slice_of(flat_tensor.numel(), local_->rank(), per_host, element));
  cross_->all_reduce(mine, op);
  if (average) {
    if (tensor.dtype() == DType::f64) {
      divide<double>(mine, size());
    } else {
      divide<float>(mine, size());
    }
  }
  for (int r = 0; r < per_host; ++r) {
    const Slice slice = slice_of(flat_tensor.numel(), r, per_host, element);
    if (slice.size > 0) local_->broadcast(view_of(flat_tensor, slice), r);
  }
}

void HierarchicalCommunicator::do_all_reduce(const Tensor& tensor, const CollectiveDesc& desc) {
  if (cross_->size() == 1) return local_->all_reduce(tensor, desc.op);
  if (local_->size() == 1) return cross_->all_reduce(tensor, desc.op);
  const bool average = desc.op == ReduceOp::avg;
  const ReduceOp stage_op = average ? ReduceOp::sum : desc.op;
  const bool half = tensor.dtype() == DType::bf16 || tensor.dtype() == DType::f16;
  if (half && (desc.op == ReduceOp::sum || average)) {
    // The flat tree rounds once, at the root: the hosts' nodes stay in f32 until then.
    Tensor wide = Tensor::empty({tensor.numel()}, DType::f32);
    convert_elements(tensor.raw_data(), tensor.dtype(), wide.raw_data(), DType::f32, tensor.numel());
    reduce_by_host(wide, stage_op, average);
    convert_elements(wide.raw_data(), DType::f32, tensor.raw_data(), tensor.dtype(), tensor.numel());
    return;
  }
  reduce_by_host(tensor, stage_op, average);
}

void HierarchicalCommunicator::do_reduce_scatter(const Tensor& input, const Tensor& output,
                                                 const CollectiveDesc& desc) {
  flat_->reduce_scatter(input, output, desc.op);
}

void HierarchicalCommunicator::do_all_gather(const Tensor& input, const Tensor& output, const CollectiveDesc&) {
  flat_->all_gather(input, output);
}

void HierarchicalCommunicator::do_broadcast(const Tensor& tensor, const CollectiveDesc& desc) {
  flat_->broadcast(tensor, desc.root);
}

void HierarchicalCommunicator::do_send(const Tensor& tensor, int peer, int tag) { flat_->send(tensor, peer, tag); }

void HierarchicalCommunicator::do_recv(const Tensor& tensor, int peer, int tag) { flat_->recv(tensor, peer, tag); }

void HierarchicalCommunicator::do_barrier(const CollectiveDesc&) { flat_->barrier(); }

std::shared_ptr<Communicator> HierarchicalCommunicator::do_split(int color, int key, const CollectiveDesc&) {
  return flat_->split(color, key);
}

}  // namespace lockstep::comm
