// The handle an asynchronous collective returns: wait() blocks until it is done on this
// rank and rethrows its error, if any. A communicator runs its collectives in the order
// they were called, sync and async alike; sends and receives each keep their own order.
#pragma once

#include <chrono>
#include <future>

namespace lockstep::comm {

class Work {
 public:
  Work() = default;
  explicit Work(std::shared_future<void> future) : future_(std::move(future)) {}

  void wait() const {
    if (future_.valid()) future_.get();
  }
  bool done() const {
    return !future_.valid() || future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::shared_future<void> future_;
};

}  // namespace lockstep::comm
