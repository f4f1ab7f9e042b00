#include "lockstep/optim/optimizer_background_updates.h"

#include <exception>
#include <utility>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/core/error.h"
#include "lockstep/core/parallel.h"

namespace lockstep::optim {

BackgroundUpdates::BackgroundUpdates(std::string what) : what_(std::move(what)), worker_([this] { work(); }) {}

BackgroundUpdates::~BackgroundUpdates() {
  wait_all_quietly();
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

void BackgroundUpdates::start(std::vector<size_t> indices, Update update, int threads, int64_t step_number) {
  {
    const std::lock_guard lock(mutex_);
    LOCKSTEP_CHECK(first_pending() == SIZE_MAX && error_.empty())
        << what_ << ": a step was queued before the previous one landed (wait_all first)";
    indices_ = std::move(indices);
    next_ = 0;
    update_ = std::move(update);
    threads_ = threads;
    step_number_ = step_number;
  }
  changed_.notify_all();
}

void BackgroundUpdates::wait_until_landed(size_t index) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return first_pending() > index || !error_.empty(); });
  // Landed, even where a later parameter's update failed.
  if (first_pending() > index) return;
  LOCKSTEP_FAIL() << error_;
}

void BackgroundUpdates::wait_all_quietly() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return first_pending() == SIZE_MAX || !error_.empty(); });
}

void BackgroundUpdates::work() {
  // The updates write raw data, as Optimizer::step does under its own guard.
  const NoGradGuard no_grad;
  int team = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || (error_.empty() && first_pending() != SIZE_MAX); });
    if (!error_.empty() || first_pending() == SIZE_MAX) return;  // stopping, nothing left to run
    const size_t index = first_pending();
    if (threads_ != team) {
      team = threads_;
      set_num_threads(team);
    }
    lock.unlock();
    std::string failure;
    try {
      update_(index);
    } catch (const std::exception& e) {
      failure = e.what();
    } catch (...) {
      failure = "an exception that is not a std::exception";
    }
    lock.lock();
    if (failure.empty()) {
      ++next_;
    } else {
      // A plain Error, even for an OutOfMemoryError: the step it belonged to is over, and
      // taking the next one again with a smaller micro-batch would not mend these weights.
      error_ = what_ + " of parameter " + std::to_string(index) + " in step " + std::to_string(step_number_) +
               " failed in the background: " + failure + "\n\tThat parameter and those after it (" +
               std::to_string(indices_.size() - next_) + " of the step's " + std::to_string(indices_.size()) +
               ") missed the update, so the weights are partly updated and the run cannot go on from them: "
               "resume from the last checkpoint";
    }
    changed_.notify_all();
  }
}

}  // namespace lockstep::optim
