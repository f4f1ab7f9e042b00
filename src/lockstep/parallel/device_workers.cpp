#include "lockstep/parallel/device_workers.h"

#include "lockstep/core/error.h"
#include "lockstep/core/parallel.h"

namespace lockstep::parallel {

DeviceWorkers::DeviceWorkers(int devices, int threads_per_device, OnError on_error) : on_error_(std::move(on_error)) {
  LOCKSTEP_CHECK(devices >= 1) << "need at least one device, got " << devices;
  LOCKSTEP_CHECK(threads_per_device >= 1) << "need at least one thread per device, got " << threads_per_device;
  threads_.reserve(static_cast<size_t>(devices));
  for (int d = 0; d < devices; ++d)
    threads_.emplace_back([this, d, threads_per_device] { loop(d, threads_per_device); });
}

DeviceWorkers::~DeviceWorkers() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void DeviceWorkers::run(const Task& task) {
  std::unique_lock lock(mutex_);
  task_ = &task;
  running_ = size();
  first_error_ = nullptr;
  ++generation_;
  wake_.notify_all();
  done_.wait(lock, [&] { return running_ == 0; });
  task_ = nullptr;
  if (first_error_) std::rethrow_exception(first_error_);
}

void DeviceWorkers::loop(int device, int threads_per_device) {
  set_num_threads(threads_per_device);
  uint64_t seen = 0;
  for (;;) {
    const Task* task = nullptr;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      task = task_;
    }
    try {
      (*task)(device);
    } catch (const std::exception& e) {
      {
        // Recorded before on_error: the other devices' errors it causes come later.
        std::lock_guard lock(mutex_);
        if (!first_error_) first_error_ = std::current_exception();
      }
      if (on_error_) on_error_(device, e.what());
    }
    std::lock_guard lock(mutex_);
    if (--running_ == 0) done_.notify_all();
  }
}

}  // namespace lockstep::parallel
