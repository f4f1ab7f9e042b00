// Optimizer offload's overlapped update: a worker thread of one optimizer runs the host's
// per-parameter updates in parameter order while the caller goes on (to the next forward),
// and readers wait for the parameters they need. Order is what makes a reader's wait
// cheap and safe: once parameter i has landed, so has every parameter before it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace lockstep::optim {

class BackgroundUpdates {
 public:
  using Update = std::function<void(size_t index)>;
  // What it says on an error: "AdamW's offloaded update", for messages.
  explicit BackgroundUpdates(std::string what);
  // Waits for the updates in flight (any error they raise is dropped: nothing may throw
  // here) and stops the worker.
  ~BackgroundUpdates();
  BackgroundUpdates(const BackgroundUpdates&) = delete;
  BackgroundUpdates& operator=(const BackgroundUpdates&) = delete;

  // Runs update(i) for each i of `indices` (increasing) on the worker, in that order, with
  // `threads` intra-op threads (the caller's team: the update splits its elements as it
  // would inline). The previous run must have landed (wait_all() first). step_number names
  // the step in error messages.
  void start(std::vector<size_t> indices, Update update, int threads, int64_t step_number);
  // Returns once every update of this run for an index <= `index` has landed. If one failed
  // before that, throws an Error naming the step, the parameter and the cause; the failure
  // stays, so every later wait says it too (the weights are partly updated).
  void wait_until_landed(size_t index);
  void wait_all() { wait_until_landed(kAll); }
  // wait_all() that reports nothing (destructors).
  void wait_all_quietly();

 private:
  static constexpr size_t kAll = std::numeric_limits<size_t>::max() - 1;
  void work();
  // Under the lock: the smallest index of the run not landed yet (SIZE_MAX when all have).
  size_t first_pending() const { return next_ < indices_.size() ? indices_[next_] : SIZE_MAX; }

  const std::string what_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<size_t> indices_;  // the run's indices, in order
  size_t next_ = 0;              // position in indices_ of the update running or next
  Update update_;
  int threads_ = 1;
  int64_t step_number_ = 0;
  bool stopping_ = false;
  std::string error_;  // the first failure, for good
  std::thread worker_;
};

}  // namespace lockstep::optim
