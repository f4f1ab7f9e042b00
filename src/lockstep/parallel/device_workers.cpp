#include "lockstep/parallel/device_workers.h"

#include <chrono>

#include "lockstep/core/error.h"
#include "lockstep/core/parallel.h"

namespace lockstep::parallel {
namespace {

// Long enough to cover what the caller does between two steps (the next batch's copy is
// a fraction of a millisecond); yielding, so a poll never keeps a runnable thread off a core.
constexpr std::chrono::microseconds kPoll{2000};

template <typename Ready>
void poll_until(const Ready& ready) {
  const auto deadline = std::chrono::steady_clock::now() + kPoll;
  while (!ready() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
}

}  // namespace

DeviceWorkers::DeviceWorkers(int devices, int threads_per_device, OnError on_error)
    : on_error_(std::move(on_error)), devices_(devices), threads_per_device_(threads_per_device) {
  LOCKSTEP_CHECK(devices >= 1) << "need at least one device, got " << devices;
  LOCKSTEP_CHECK(threads_per_device >= 1) << "need at least one thread per device, got " << threads_per_device;
  threads_.reserve(static_cast<size_t>(devices - 1));
  for (int d = 1; d < devices; ++d) threads_.emplace_back([this, d] { loop(d); });
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
  {
    std::lock_guard lock(mutex_);
    task_ = &task;
    running_ = devices_;
    first_error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  // Device 0 on this thread, with the device's team size for the while.
  const int saved = num_threads();
  set_num_threads(threads_per_device_);
  run_one(0, task);
  set_num_threads(saved);
  const auto finished = [&] { return running_.load() == 0; };
  poll_until(finished);
  std::unique_lock lock(mutex_);
  done_.wait(lock, finished);
  task_ = nullptr;
  if (first_error_) std::rethrow_exception(first_error_);
}

void DeviceWorkers::run_one(int device, const Task& task) {
  try {
    task(device);
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

void DeviceWorkers::loop(int device) {
  set_num_threads(threads_per_device_);
  uint64_t seen = 0;
  for (;;) {
    const Task* task = nullptr;
    const auto posted = [&] { return stopping_.load() || generation_.load() != seen; };
    poll_until(posted);
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, posted);
      if (stopping_) return;
      seen = generation_;
      task = task_;
    }
    run_one(device, *task);
  }
}

}  // namespace lockstep::parallel
