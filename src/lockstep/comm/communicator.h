// A Communicator is a group of ranks that exchange tensors: the collectives data, tensor
// and pipeline parallelism are built from, with one interface over four backends (local
// threads, shared memory between processes, MPI, NCCL). Every reduction of the backends
// that control their order follows tree_reduce's order, so results are the same bits on
// every rank and backend. Calls are collective: every rank makes the same calls, in the
// same order; arguments are compared across ranks and a mismatch names both sides.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/comm/collective.h"
#include "lockstep/comm/flight_recorder.h"
#include "lockstep/comm/reduce_op.h"
#include "lockstep/comm/work.h"
#include "lockstep/core/tensor.h"

namespace lockstep::comm {

// How long a rank waits for the others before it gives up and names the missing ones.
// LOCKSTEP_COMM_TIMEOUT (seconds) overrides the default.
std::chrono::milliseconds default_timeout();

// Raised when ranks cannot complete a call: a peer that died, left, or never arrived. The
// communicator is unusable afterwards; every later call rethrows the first failure.
class CommError : public Error {
 public:
  using Error::Error;
};

class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  Communicator(int rank, int size);
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual const char* backend() const = 0;  // "local", "shm", "mpi", "nccl"
  // How all_reduce travels where the group layers it over hosts ("2 hosts x 2 ranks: shm
  // within a host, mpi across"); "" where it is the backend's own.
  virtual std::string route() const { return ""; }

  // In place: every rank's tensor ends as the reduction of all ranks' tensors.
  void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum);
  // input holds size() equal slices; rank r's output gets the reduction of slice r.
  void reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op = ReduceOp::sum);
  // output holds size() slices; slice r is rank r's input. The input may be this rank's own
  // slice of the output (in place, as NCCL and MPI_IN_PLACE allow).
  void all_gather(const Tensor& input, const Tensor& output);
  // Every rank's tensor ends as root's.
  void broadcast(const Tensor& tensor, int root);
  // Point to point; messages between a pair arrive in the order sent. The receiver's
  // tensor must match the sender's in dtype and element count.
  void send(const Tensor& tensor, int peer, int tag = 0);
  void recv(const Tensor& tensor, int peer, int tag = 0);
  void barrier();
  // Seconds this rank has spent in blocking calls on this communicator, waiting for its
  // peers included: a layout whose compute is interleaved with collectives (tensor
  // parallelism) tells its communication time apart with it.
  double blocking_seconds() const { return blocking_seconds_.load(std::memory_order_relaxed); }
  // Ranks passing the same color form a new communicator, ranked by (key, old rank);
  // color < 0 takes no part and gets nullptr (MPI_UNDEFINED). Collective on this group.
  std::shared_ptr<Communicator> split(int color, int key);

  // Asynchronous forms: queued behind the earlier calls of their kind (collectives, sends,
  // receives) and run by that kind's worker thread. The tensors must stay alive and
  // untouched until wait() returns. A large send blocks until the peer receives it, so
  // two ranks exchanging large messages use send_async + recv, as with MPI.
  Work all_reduce_async(const Tensor& tensor, ReduceOp op = ReduceOp::sum);
  Work reduce_scatter_async(const Tensor& input, const Tensor& output, ReduceOp op = ReduceOp::sum);
  Work all_gather_async(const Tensor& input, const Tensor& output);
  Work broadcast_async(const Tensor& tensor, int root);
  Work send_async(const Tensor& tensor, int peer, int tag = 0);
  Work recv_async(const Tensor& tensor, int peer, int tag = 0);

  // A tensor the peers of this group can read directly (shared memory on `shm`), so the
  // in-place algorithm needs no staging copy. Collective: every rank allocates the same
  // shape. Other backends return an ordinary tensor on `device`.
  virtual Tensor empty_shared(const Shape& shape, DType dtype, Device device = Device::cpu());
  // One zeroed tensor whose bytes are the same memory on every rank of this group (threads
  // of `local`, processes of `shm`), so one rank's writes are the others' after a barrier.
  // Collective: every rank asks for the same shape. Undefined where the ranks share no
  // memory (`mpi`, `nccl`), that is unless shares_memory().
  virtual Tensor empty_common(const Shape& shape, DType dtype, Device device = Device::cpu());
  virtual bool shares_memory() const { return false; }
  // The memory this backend moves: host memory, or (`nccl`) its GPU's. Tensors on another
  // kind of device are staged through a copy there (staged_tensor.h), so every call takes
  // tensors on any device.
  virtual Device memory() const { return Device::cpu(); }

  // How the flight recorder (flight_recorder.h) names this group: "world" for a job's
  // communicator, "world/split3/color1" for what its third collective, a split, made.
  const std::string& group_name() const { return group_name_; }

  // May be changed at any time; calls already waiting keep the limit they started with.
  std::chrono::milliseconds timeout() const { return timeout_.load(); }
  // This rank gives up (its own code failed): peers waiting for it, on this group and on
  // every group split from it (a mesh's stage peers wait in those), fail at once with
  // `reason` instead of at their timeout.
  void abort(const std::string& reason);
  void set_timeout(std::chrono::milliseconds timeout) { timeout_.store(timeout); }

 protected:
  // abort()'s part for this group: tell its peers. Backends that cannot do nothing.
  virtual void abort_peers(const std::string& /*reason*/) {}

  // Backends implement these. Tensors are contiguous, in the backend's memory() and locally
  // consistent (sizes agree with size(), dtypes reducible, ranks in range); desc carries
  // the call's sequence number and arguments for the cross-rank check.
  virtual void do_all_reduce(const Tensor& tensor, const CollectiveDesc& desc) = 0;
  virtual void do_reduce_scatter(const Tensor& input, const Tensor& output, const CollectiveDesc& desc) = 0;
  virtual void do_all_gather(const Tensor& input, const Tensor& output, const CollectiveDesc& desc) = 0;
  virtual void do_broadcast(const Tensor& tensor, const CollectiveDesc& desc) = 0;
  virtual void do_send(const Tensor& tensor, int peer, int tag) = 0;
  virtual void do_recv(const Tensor& tensor, int peer, int tag) = 0;
  virtual void do_barrier(const CollectiveDesc& desc) = 0;
  virtual std::shared_ptr<Communicator> do_split(int color, int key, const CollectiveDesc& desc) = 0;

  // Backends call this from their destructors, before their own members go away: it drains
  // the asynchronous queue.
  void stop_worker();

 private:
  // Each call checks its arguments on this rank and returns the work to run.
  std::function<void()> prepare_all_reduce(const Tensor& tensor, ReduceOp op);
  std::function<void()> prepare_reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op);
  std::function<void()> prepare_all_gather(const Tensor& input, const Tensor& output);
  std::function<void()> prepare_broadcast(const Tensor& tensor, int root);
  std::function<void()> prepare_send(const Tensor& tensor, int peer, int tag);
  std::function<void()> prepare_recv(const Tensor& tensor, int peer, int tag);
  CollectiveDesc next_desc(CollectiveKind kind, const Tensor* tensor, int64_t count, ReduceOp op, int root);
  // Records the call in the flight recorder as issued now, and returns body wrapped to
  // record when it starts waiting and how it ends.
  std::function<void()> recorded(FlightCall call, std::function<void()> body) const;
  std::function<void()> recorded(const CollectiveDesc& desc, std::function<void()> body) const;

  // Calls run in one of three lanes, each in call order: collectives, sends, receives.
  // Sends and receives have lanes of their own so that a rank can send and receive at
  // once (a ring exchange of large messages cannot deadlock on send_async + recv).
  enum LaneId { kCollectives = 0, kSends = 1, kReceives = 2 };
  struct Lane {
    std::condition_variable changed;
    std::deque<std::packaged_task<void()>> queue;
    std::thread worker;
    std::shared_future<void> last;  // the last async call queued
  };
  // Runs body now, after the lane's earlier async calls, recording the first failure.
  void run_sync(LaneId lane, const std::function<void()>& body);
  Work run_async(LaneId lane, std::function<void()> body);
  void guarded(const std::function<void()>& body);
  void worker_loop(Lane& lane);

  int rank_;
  int size_;
  std::string group_name_ = "world";
  std::atomic<std::chrono::milliseconds> timeout_;  // read by the lanes' worker threads
  std::mutex subgroups_mutex_;
  std::vector<std::weak_ptr<Communicator>> subgroups_;  // what split() made, for abort()
  uint64_t sequence_ = 0;
  std::atomic<double> blocking_seconds_{0};

  std::mutex mutex_;  // guards the lanes' queues, stopping_ and failure_
  Lane lanes_[3];
  bool stopping_ = false;
  std::string failure_;  // the first error; later calls rethrow it
};

}  // namespace lockstep::comm
