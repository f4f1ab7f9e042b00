#include "lockstep/comm/communicator.h"

#include <cstdlib>

#include "lockstep/comm/staged_tensor.h"
#include "lockstep/comm/tree_reduce.h"

namespace lockstep::comm {

std::chrono::milliseconds default_timeout() {
  if (const char* text = std::getenv("LOCKSTEP_COMM_TIMEOUT")) {
    char* end = nullptr;
    const double seconds = std::strtod(text, &end);
    LOCKSTEP_CHECK(end != text && *end == '\0' && seconds > 0)
        << "LOCKSTEP_COMM_TIMEOUT must be a positive number of seconds, got '" << text << "'";
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  }
  return std::chrono::minutes(5);
}

Communicator::Communicator(int rank, int size) : rank_(rank), size_(size), timeout_(default_timeout()) {
  LOCKSTEP_CHECK(size >= 1 && rank >= 0 && rank < size) << "rank " << rank << " is outside a group of " << size;
}

Communicator::~Communicator() { stop_worker(); }

void Communicator::stop_worker() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  for (Lane& lane : lanes_) {
    lane.changed.notify_all();
    if (lane.worker.joinable()) lane.worker.join();
  }
}

namespace {

void check_contiguous(const Tensor& t, const char* what, const char* call) {
  LOCKSTEP_CHECK(t.defined()) << call << ": the " << what << " tensor is undefined";
  LOCKSTEP_CHECK(t.is_contiguous()) << call << ": the " << what
                                    << " tensor must be contiguous (its bytes are sent as they lie); call "
                                       ".contiguous() first";
}

void check_peer(int peer, int size, const char* call) {
  LOCKSTEP_CHECK(peer >= 0 && peer < size)
      << call << ": rank " << peer << " is outside this group of " << size << " ranks (0.." << size - 1 << ")";
}

FlightCall point_to_point(const char* call, const Tensor& tensor, int peer, int tag) {
  FlightCall record;
  record.call = call;
  record.count = tensor.numel();
  record.dtype = dtype_name(tensor.dtype());
  record.peer = peer;
  record.tag = tag;
  return record;
}

}  // namespace

CollectiveDesc Communicator::next_desc(CollectiveKind kind, const Tensor* tensor, int64_t count, ReduceOp op,
                                       int root) {
  CollectiveDesc desc;
  desc.sequence = ++sequence_;
  desc.kind = kind;
  desc.count = count;
  desc.dtype = tensor ? tensor->dtype() : DType::f32;
  desc.op = op;
  desc.root = root;
  return desc;
}

std::function<void()> Communicator::recorded(FlightCall call, std::function<void()> body) const {
  call.group = group_name_;
  call.group_rank = rank_;
  call.group_size = size_;
  const uint64_t id = FlightRecorder::process().issued(std::move(call));
  return [id, body = std::move(body)] {
    FlightRecorder& recorder = FlightRecorder::process();
    recorder.started(id);
    try {
      body();
    } catch (const std::exception& error) {
      recorder.ended(id, error.what());
      throw;
    }
    recorder.ended(id);
  };
}

std::function<void()> Communicator::recorded(const CollectiveDesc& desc, std::function<void()> body) const {
  FlightCall call;
  call.call = collective_name(desc.kind);
  call.sequence = desc.sequence;
  call.count = desc.count;
  call.dtype = desc.kind == CollectiveKind::barrier || desc.kind == CollectiveKind::split ? "" : dtype_name(desc.dtype);
  if (desc.kind == CollectiveKind::all_reduce || desc.kind == CollectiveKind::reduce_scatter) {
    call.op = reduce_op_name(desc.op);
  }
  if (desc.kind == CollectiveKind::broadcast) call.peer = desc.root;
  return recorded(std::move(call), std::move(body));
}

void Communicator::guarded(const std::function<void()>& body) {
  {
    std::lock_guard lock(mutex_);
    if (!failure_.empty()) throw CommError("this communicator failed earlier and cannot be used: " + failure_);
  }
  try {
    body();
  } catch (const std::exception& error) {
    FlightRecorder::process().failed(error.what());
    std::lock_guard lock(mutex_);
    if (failure_.empty()) failure_ = error.what();
    throw;
  }
}

void Communicator::run_sync(LaneId id, const std::function<void()>& body) {
  const auto start = std::chrono::steady_clock::now();
  struct Count {  // counts the call however it ends
    std::atomic<double>& total;
    std::chrono::steady_clock::time_point start;
    ~Count() {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      total.fetch_add(seconds, std::memory_order_relaxed);
    }
  } count{blocking_seconds_, start};
  std::shared_future<void> pending;
  {
    std::lock_guard lock(mutex_);
    pending = lanes_[id].last;
  }
  // Earlier async calls of the lane run first; their errors belong to their own handles.
  if (pending.valid()) pending.wait();
  guarded(body);
}

Work Communicator::run_async(LaneId id, std::function<void()> body) {
  // The future shares its state with the task, callable included: the call's tensors are
  // moved out and released when it has run, not when the lane's last future goes.
  std::packaged_task<void()> task([this, body = std::move(body)]() mutable {
    const std::function<void()> run = std::move(body);
    body = nullptr;
    guarded(run);
  });
  std::shared_future<void> future = task.get_future().share();
  Lane& lane = lanes_[id];
  {
    std::lock_guard lock(mutex_);
    if (!lane.worker.joinable()) lane.worker = std::thread([this, &lane] { worker_loop(lane); });
    lane.queue.push_back(std::move(task));
    lane.last = future;
  }
  lane.changed.notify_one();
  return Work(future);
}

void Communicator::worker_loop(Lane& lane) {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock lock(mutex_);
      lane.changed.wait(lock, [&] { return stopping_ || !lane.queue.empty(); });
      if (lane.queue.empty()) return;  // stopping, and everything queued has run
      task = std::move(lane.queue.front());
      lane.queue.pop_front();
    }
    task();
  }
}

// ---- the calls: check locally, describe for the cross-rank check, run ----

std::function<void()> Communicator::prepare_all_reduce(const Tensor& tensor, ReduceOp op) {
  check_contiguous(tensor, "in-place", "all_reduce");
  check_reducible(tensor.dtype(), op);
  const CollectiveDesc desc = next_desc(CollectiveKind::all_reduce, &tensor, tensor.numel(), op, 0);
  return recorded(desc, [this, tensor, desc] {
    const StagedTensor staged(tensor, memory(), /*reads=*/true);
    do_all_reduce(staged.get(), desc);
    staged.write_back();
  });
}

std::function<void()> Communicator::prepare_reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) {
  check_contiguous(input, "input", "reduce_scatter");
  check_contiguous(output, "output", "reduce_scatter");
  LOCKSTEP_CHECK(input.dtype() == output.dtype())
      << "reduce_scatter: input is " << dtype_name(input.dtype()) << " but output is " << dtype_name(output.dtype());
  LOCKSTEP_CHECK(input.numel() == output.numel() * size())
      << "reduce_scatter: input has " << input.numel() << " elements, output " << output.numel()
      << "; input must hold one output-sized slice per rank (" << size() << " x " << output.numel() << " = "
      << output.numel() * size() << ")";
  check_reducible(input.dtype(), op);
  const CollectiveDesc desc = next_desc(CollectiveKind::reduce_scatter, &input, output.numel(), op, 0);
  return recorded(desc, [this, input, output, desc] {
    const StagedTensor in(input, memory(), /*reads=*/true), out(output, memory(), /*reads=*/false);
    do_reduce_scatter(in.get(), out.get(), desc);
    out.write_back();
  });
}

std::function<void()> Communicator::prepare_all_gather(const Tensor& input, const Tensor& output) {
  check_contiguous(input, "input", "all_gather");
  check_contiguous(output, "output", "all_gather");
  LOCKSTEP_CHECK(input.dtype() == output.dtype())
      << "all_gather: input is " << dtype_name(input.dtype()) << " but output is " << dtype_name(output.dtype());
  LOCKSTEP_CHECK(output.numel() == input.numel() * size())
      << "all_gather: input has " << input.numel() << " elements, output " << output.numel()
      << "; output must hold one input-sized slice per rank (" << size() << " x " << input.numel() << " = "
      << input.numel() * size() << ")";
  const CollectiveDesc desc = next_desc(CollectiveKind::all_gather, &input, input.numel(), ReduceOp::sum, 0);
  return recorded(desc, [this, input, output, desc] {
    const StagedTensor in(input, memory(), /*reads=*/true), out(output, memory(), /*reads=*/false);
    do_all_gather(in.get(), out.get(), desc);
    out.write_back();
  });
}

std::function<void()> Communicator::prepare_broadcast(const Tensor& tensor, int root) {
  check_contiguous(tensor, "in-place", "broadcast");
  check_peer(root, size(), "broadcast");
  const CollectiveDesc desc = next_desc(CollectiveKind::broadcast, &tensor, tensor.numel(), ReduceOp::sum, root);
  return recorded(desc, [this, tensor, desc] {
    const StagedTensor staged(tensor, memory(), /*reads=*/true);
    do_broadcast(staged.get(), desc);
    staged.write_back();
  });
}

std::function<void()> Communicator::prepare_send(const Tensor& tensor, int peer, int tag) {
  check_contiguous(tensor, "sent", "send");
  check_peer(peer, size(), "send");
  LOCKSTEP_CHECK(peer != rank()) << "send: rank " << rank() << " cannot send to itself";
  return recorded(point_to_point("send", tensor, peer, tag), [this, tensor, peer, tag] {
    do_send(StagedTensor(tensor, memory(), /*reads=*/true).get(), peer, tag);
  });
}

std::function<void()> Communicator::prepare_recv(const Tensor& tensor, int peer, int tag) {
  check_contiguous(tensor, "receiving", "recv");
  check_peer(peer, size(), "recv");
  LOCKSTEP_CHECK(peer != rank()) << "recv: rank " << rank() << " cannot receive from itself";
  return recorded(point_to_point("recv", tensor, peer, tag), [this, tensor, peer, tag] {
    const StagedTensor staged(tensor, memory(), /*reads=*/false);
    do_recv(staged.get(), peer, tag);
    staged.write_back();
  });
}

void Communicator::all_reduce(const Tensor& tensor, ReduceOp op) {
  run_sync(kCollectives, prepare_all_reduce(tensor, op));
}
void Communicator::reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) {
  run_sync(kCollectives, prepare_reduce_scatter(input, output, op));
}
void Communicator::all_gather(const Tensor& input, const Tensor& output) {
  run_sync(kCollectives, prepare_all_gather(input, output));
}
void Communicator::broadcast(const Tensor& tensor, int root) {
  run_sync(kCollectives, prepare_broadcast(tensor, root));
}
void Communicator::send(const Tensor& tensor, int peer, int tag) { run_sync(kSends, prepare_send(tensor, peer, tag)); }
void Communicator::recv(const Tensor& tensor, int peer, int tag) {
  run_sync(kReceives, prepare_recv(tensor, peer, tag));
}

Work Communicator::all_reduce_async(const Tensor& tensor, ReduceOp op) {
  return run_async(kCollectives, prepare_all_reduce(tensor, op));
}
Work Communicator::reduce_scatter_async(const Tensor& input, const Tensor& output, ReduceOp op) {
  return run_async(kCollectives, prepare_reduce_scatter(input, output, op));
}
Work Communicator::all_gather_async(const Tensor& input, const Tensor& output) {
  return run_async(kCollectives, prepare_all_gather(input, output));
}
Work Communicator::broadcast_async(const Tensor& tensor, int root) {
  return run_async(kCollectives, prepare_broadcast(tensor, root));
}
Work Communicator::send_async(const Tensor& tensor, int peer, int tag) {
  return run_async(kSends, prepare_send(tensor, peer, tag));
}
Work Communicator::recv_async(const Tensor& tensor, int peer, int tag) {
  return run_async(kReceives, prepare_recv(tensor, peer, tag));
}

void Communicator::barrier() {
  const CollectiveDesc desc = next_desc(CollectiveKind::barrier, nullptr, 0, ReduceOp::sum, 0);
  run_sync(kCollectives, recorded(desc, [this, desc] { do_barrier(desc); }));
}

std::shared_ptr<Communicator> Communicator::split(int color, int key) {
  const CollectiveDesc desc = next_desc(CollectiveKind::split, nullptr, 0, ReduceOp::sum, 0);
  std::shared_ptr<Communicator> result;
  run_sync(kCollectives, recorded(desc, [&] { result = do_split(color, key, desc); }));
  if (result) {
    result->set_timeout(timeout());
    result->group_name_ = group_name_ + "/split" + std::to_string(desc.sequence) + "/color" + std::to_string(color);
    const std::lock_guard lock(subgroups_mutex_);
    subgroups_.push_back(result);
  }
  return result;
}

void Communicator::abort(const std::string& reason) {
  abort_peers(reason);
  std::vector<std::shared_ptr<Communicator>> live;
  {
    const std::lock_guard lock(subgroups_mutex_);
    for (const auto& subgroup : subgroups_) {
      if (auto group = subgroup.lock()) live.push_back(std::move(group));
    }
  }
  for (const auto& group : live) group->abort(reason);
}

Tensor Communicator::empty_shared(const Shape& shape, DType dtype, Device device) {
  return Tensor::empty(shape, dtype, device);
}

Tensor Communicator::empty_common(const Shape& /*shape*/, DType /*dtype*/, Device /*device*/) { return Tensor(); }

}  // namespace lockstep::comm
