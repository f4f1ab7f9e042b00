// What the `mpi` backend keeps per process rather than per communicator: MPI is initialized
// once and finalized once (at exit, if we initialized it), MPI calls are serialized when MPI
// cannot take them from several threads, and one watchdog aborts the job when a call hangs
// (MPI itself cannot time out a blocking call).
#pragma once

#include <chrono>
#include <condition_variable>
#include <list>
#include <mutex>
#include <string>
#include <thread>

namespace lockstep::comm {

class MpiProcess {
 public:
  // Initializes MPI on first use (asking for MPI_THREAD_MULTIPLE) unless the program already
  // did, and arranges MPI_Finalize at exit if we initialized it. Never destroyed, so
  // communicators outliving main() still find it (they see MPI finalized and skip freeing).
  static MpiProcess& get();

  // Held around each MPI operation: a real lock only where MPI gave less than
  // MPI_THREAD_MULTIPLE, else empty.
  std::unique_lock<std::mutex> lock();
  bool serialized() const { return serialized_; }
  int world_rank() const { return world_rank_; }

  // While a Deadline lives, the watchdog aborts the whole job (MPI_Abort) if it lives longer
  // than `timeout`, after printing which call of which rank did not complete.
  class Deadline {
   public:
    Deadline(std::string what, std::chrono::milliseconds timeout);
    ~Deadline();
    Deadline(const Deadline&) = delete;
    Deadline& operator=(const Deadline&) = delete;

   private:
    struct Entry {
      std::string what;
      std::chrono::milliseconds timeout;
      std::chrono::steady_clock::time_point deadline;
    };
    friend class MpiProcess;
    std::list<Entry>::iterator entry_;
  };

 private:
  MpiProcess();
  void watch();    // the watchdog thread
  void at_exit();  // stops the watchdog, then finalizes MPI if we initialized it

  bool initialized_here_ = false;
  bool serialized_ = true;
  int world_rank_ = 0;
  std::mutex mpi_mutex_;

  std::mutex watch_mutex_;  // guards the members below
  std::condition_variable watch_changed_;
  std::list<Deadline::Entry> active_;
  std::chrono::steady_clock::time_point next_check_ = std::chrono::steady_clock::time_point::max();
  bool stopping_ = false;
  std::thread watchdog_;
};

// MPI_Error_string's text for an MPI return code, with the code.
std::string mpi_error_string(int code);

}  // namespace lockstep::comm
