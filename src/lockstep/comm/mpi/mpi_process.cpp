#include "lockstep/comm/mpi/mpi_process.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "lockstep/core/error.h"

namespace lockstep::comm {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  std::ostringstream out;
  if (MPI_Error_string(code, text, &length) == MPI_SUCCESS) {
    out << std::string(text, static_cast<size_t>(length)) << " (MPI error " << code << ")";
  } else {
    out << "MPI error " << code;
  }
  return out.str();
}

MpiProcess& MpiProcess::get() {
  static MpiProcess* const process = new MpiProcess();
  return *process;
}

MpiProcess::MpiProcess() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  LOCKSTEP_CHECK(!finalized) << "the mpi backend cannot start: MPI was already finalized in this process, and MPI "
                                "can be initialized only once per process";
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    // MULTIPLE lets communicators from split() run on different threads at once; with less
    // we serialize every MPI call of the process (see lock()).
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    LOCKSTEP_CHECK(rc == MPI_SUCCESS) << "MPI_Init_thread failed: " << mpi_error_string(rc);
    initialized_here_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  serialized_ = provided < MPI_THREAD_MULTIPLE;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  watchdog_ = std::thread([this] { watch(); });
  // Registered after MPI_Init, so it runs before anything registered earlier (MPI finalizes
  // before static objects constructed before the first communicator are destroyed; those
  // see MPI finalized and skip their MPI calls).
  std::atexit([] { get().at_exit(); });
}

std::unique_lock<std::mutex> MpiProcess::lock() {
  if (!serialized_) return {};
  return std::unique_lock(mpi_mutex_);
}

void MpiProcess::at_exit() {
  {
    std::lock_guard lock(watch_mutex_);
    stopping_ = true;
  }
  watch_changed_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  if (initialized_here_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

void MpiProcess::watch() {
  using Clock = std::chrono::steady_clock;
  std::unique_lock lock(watch_mutex_);
  while (!stopping_) {
    const Clock::time_point now = Clock::now();
    Clock::time_point earliest = Clock::time_point::max();
    for (const Deadline::Entry& entry : active_) {
      if (entry.deadline <= now) {
        std::ostringstream message;
        message << "lockstep: rank " << world_rank_ << ": " << entry.what << " did not complete within "
                << static_cast<double>(entry.timeout.count()) / 1000.0
                << " s; a rank may have died or be stuck elsewhere; aborting the job\n";
        const std::string text = message.str();
        std::fputs(text.c_str(), stderr);
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
        std::_Exit(1);  // MPI_Abort does not return; in case it does
      }
      earliest = std::min(earliest, entry.deadline);
    }
    next_check_ = earliest;
    if (earliest == Clock::time_point::max()) {
      watch_changed_.wait(lock);
    } else {
      watch_changed_.wait_until(lock, earliest);
    }
  }
}

MpiProcess::Deadline::Deadline(std::string what, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  // Far enough for "never" without overflowing the clock's nanoseconds.
  const auto bounded = std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24 * 365 * 100));
  const Clock::time_point deadline = Clock::now() + bounded;
  MpiProcess& process = get();
  std::lock_guard lock(process.watch_mutex_);
  entry_ = process.active_.insert(process.active_.end(), Entry{std::move(what), timeout, deadline});
  // Wake the watchdog only when it sleeps past this deadline: most calls need no wake-up.
  if (deadline < process.next_check_) {
    process.next_check_ = deadline;
    process.watch_changed_.notify_one();
  }
}

MpiProcess::Deadline::~Deadline() {
  MpiProcess& process = get();
  std::lock_guard lock(process.watch_mutex_);
  process.active_.erase(entry_);
}

}  // namespace lockstep::comm
