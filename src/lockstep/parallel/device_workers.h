// One long-lived thread per device, device 0 being the caller's own. Made once, so each
// keeps its OpenMP team and its thread-local scratch from step to step (a fresh
// std::thread per step would build a new OpenMP pool every step), and one device is one
// pool, as in a program without data parallelism (a second, idle pool spinning on the same
// cores halved the speed). run(task) runs task(d) for every device and returns when all
// are done; if any task threw, it then rethrows the first error in time (the cause; the
// errors of devices that stopped because of it come later).
//
// Between steps the workers poll for the next one for a moment before they sleep: a thread
// woken through a condition variable starts tens of microseconds late, and on every step
// the other devices would wait that long for it at the all-reduce.
#pragma once

#include <atomic>
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
  int size() const { return devices_; }

 private:
  void loop(int device);
  void run_one(int device, const Task& task);

  OnError on_error_;
  int devices_;
  int threads_per_device_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const Task* task_ = nullptr;
  // Written under mutex_; atomic so the polls can read them without it.
  std::atomic<uint64_t> generation_ = 0;  // one per run()
  std::atomic<int> running_ = 0;
  std::atomic<bool> stopping_ = false;
  std::exception_ptr first_error_;
  std::vector<std::thread> threads_;
};

}  // namespace lockstep::parallel
