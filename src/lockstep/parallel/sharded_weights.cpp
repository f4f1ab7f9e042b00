#include "lockstep/parallel/sharded_weights.h"

#include "lockstep/ops/ops.h"

namespace lockstep::parallel {

ShardedWeights::ShardedWeights(const FlatGradients& layout, comm::Communicator& comm)
    : layout_(layout), comm_(comm), gathering_(layout.units().size()) {
  LOCKSTEP_CHECK(layout.shards() % comm.size() == 0)
      << "the flat buffer's units are padded for " << layout.shards() << " shards, which do not cut into "
      << comm.size() << " ranks' parts: build its FlatGradients with shards = " << comm.size();
  for (const FlatUnit& unit : layout.units()) {
    const Tensor& sample = layout.params().at(unit.params.front());
    Tensor full = Tensor::empty({unit.end - unit.begin}, sample.dtype(), sample.device());
    if (unit.params_end < unit.end) slice(full, 0, unit.params_end - unit.begin, unit.end - unit.begin).zero();
    for (size_t p : unit.params) layout.view(full, p, unit.begin).copy_from(layout.params()[p]);
    const int64_t part = unit.shard_size(comm.size());
    Tensor mine = Tensor::empty({part}, sample.dtype(), sample.device());
    mine.copy_from(slice(full, 0, part * comm.rank(), part * (comm.rank() + 1)));
    mine.set_requires_grad(true);
    for (size_t p : unit.params) layout.params()[p].set_data(layout.view(full, p, unit.begin));
    full.storage()->release_bytes();
    full_.push_back(std::move(full));
    parts_.push_back(std::move(mine));
  }
}

ShardedWeights::~ShardedWeights() { abandon(); }

void ShardedWeights::prefetch(size_t u) {
  if (held(u)) return;
  full_[u].storage()->allocate_bytes();
  gathering_[u] = comm_.all_gather_async(parts_[u], full_[u]);
}

void ShardedWeights::gather(size_t u) {
  prefetch(u);
  if (!gathering_[u]) return;
  const comm::Work work = *gathering_[u];
  gathering_[u].reset();
  work.wait();
}

void ShardedWeights::release(size_t u) {
  if (gathering_[u]) gather(u);  // the all-gather writes into the bytes
  full_[u].storage()->release_bytes();
}

void ShardedWeights::gather_all() {
  for (size_t u = 0; u < full_.size(); ++u) prefetch(u);
  for (size_t u = 0; u < full_.size(); ++u) gather(u);
}

void ShardedWeights::release_all() {
  for (size_t u = 0; u < full_.size(); ++u) release(u);
}

void ShardedWeights::abandon() {
  for (size_t u = 0; u < full_.size(); ++u) {
    if (gathering_[u]) {
      try {
        gathering_[u]->wait();
      } catch (const std::exception&) {
      }
      gathering_[u].reset();
    }
    full_[u].storage()->release_bytes();
  }
}

void ShardedWeights::write_all(const std::function<void()>& write) {
  for (size_t u = 0; u < full_.size(); ++u) {
    if (gathering_[u]) gather(u);
    full_[u].storage()->allocate_bytes();
    const FlatUnit& unit = layout_.units()[u];
    if (unit.params_end < unit.end) slice(full_[u], 0, unit.params_end - unit.begin, unit.end - unit.begin).zero();
  }
  try {
    write();
  } catch (...) {
    release_all();
    throw;
  }
  for (size_t u = 0; u < full_.size(); ++u) {
    const int64_t part = parts_[u].numel();
    parts_[u].copy_from(slice(full_[u], 0, part * comm_.rank(), part * (comm_.rank() + 1)));
  }
  release_all();
}

}  // namespace lockstep::parallel
