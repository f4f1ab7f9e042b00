// One long-lived thread per device. Made once, so each keeps its OpenMP team and its
// thread-local scratch from step to step (a fresh std::thread per step would build a new
// OpenMP pool every step). run(task) runs task(d) on every worker and returns when all
// are done; if any task threw, it then rethrows the first error in time (the cause; the
// errors of devices that stopped because of it come later).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace lockstep::parallel {

class DeviceWorkers {
 public:
  using Task = std::function<void(int device)>;
  // on_error(d, message) runs on worker d right after its task threw (data parallelism
  // aborts its communicator there, so the other devices stop waiting for this one).
  using OnError = std::function<void(int device, const std::string& message)>;

  // Each worker computes with threads_per_device intra-op threads.
  DeviceWorkers(int devices, int threads_per_device, OnError on_error);
  ~DeviceWorkers();
  DeviceWorkers(const DeviceWorkers&) = delete;
  DeviceWorkers& operator=(const DeviceWorkers&) = delete;

  void run(const Task& task);
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void loop(int device, int threads_per_device);

  OnError on_error_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const Task* task_ = nullptr;
  uint64_t generation_ = 0;  // one per run()
  int running_ = 0;
  bool stopping_ = false;
  std::exception_ptr first_error_;
  std::vector<std::thread> threads_;
};

}  // namespace lockstep::parallel
