// The flight recorder: what this process's ranks last asked of their communicators, and
// what its training loop is doing, kept so that a hang can be explained after the fact.
//
// Every communicator call (collectives, sends, receives) is recorded when it is issued,
// when it starts to wait for its peers and when it ends, in a ring of the last calls. The
// training loop says which step, micro-batch and phase (forward, backward, optimizer, ...)
// it is in. When LOCKSTEP_FLIGHT_DIR names a folder (`lockstep run` sets it to the job's
// log folder), the record is written to DIR/rank<R>.flight.json while it changes (at most
// five times a second, and every second when it does not: a record that ages belongs to a
// stopped or frozen process), at once when a call fails (a timeout, a dead peer), on
// SIGUSR2 and at exit; `lockstep run` reads those files to say which rank holds the others back. Without
// the variable, SIGUSR2 prints the record to stderr. Under threads (one process driving
// several devices) the activity is the process's: the last thread to set it wins.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::comm {

// Where a call is: issued (queued behind earlier calls), waiting (running, for its peers),
// done, or failed.
enum class CallState : uint8_t { issued, waiting, done, failed };
const char* call_state_name(CallState state);

struct FlightCall {
  uint64_t id = 0;         // the recorder's order of calls
  std::string group = "";  // "world", or what a split made of it: "world/split3/color1"
  int group_rank = 0;      // this rank's place in that group, and the group's size
  int group_size = 1;
  std::string call = "";   // "all_reduce", "send", ...
  uint64_t sequence = 0;   // the group's collective number (as errors name it: all_reduce #12); 0 for send/recv
  int64_t count = 0;       // elements
  std::string dtype = "";  // "f32"
  std::string op = "";     // reductions' "sum", "avg", ...; else empty
  int peer = -1;           // send's and recv's peer, broadcast's root (group ranks); else -1
  int tag = 0;
  CallState state = CallState::issued;
  int64_t issued_ms = 0;  // Unix time in milliseconds; 0 while it has not happened
  int64_t started_ms = 0;
  int64_t ended_ms = 0;
  std::string error = "";  // a failed call's message
};

// The loop's position. -1: not known (outside a step, or no micro-batches).
struct FlightActivity {
  int64_t step = -1;
  int64_t micro_batch = -1;
  std::string phase = "starting";
  int64_t since_ms = 0;  // when the phase began
};

// Each group this process has called on, with how far its collectives have come.
struct FlightGroup {
  std::string name = "";
  int rank = 0;
  int size = 1;
  uint64_t issued = 0;  // the last collective sequence number issued on it
  uint64_t done = 0;    // ... and ended (in order: collectives of a group end in order)
};

// One process's record, as written to its file.
struct FlightReport {
  int rank = -1;  // the process's rank in the job
  int64_t pid = 0;
  std::string reason = "";  // why it was written: "running", "failure", "signal", "exit"
  int64_t written_ms = 0;
  int64_t last_progress_ms = 0;  // the last call that ended or phase that began
  FlightActivity activity;
  std::string failure = "";  // the first communication error, if any
  std::vector<FlightGroup> groups = {};
  std::vector<FlightCall> calls = {};  // oldest first
};

std::string flight_report_json(const FlightReport& report);
// Throws Error naming what is wrong with the text.
FlightReport parse_flight_report(const std::string& json);
// "all_reduce #4411 on world (1000 f32, sum)", "recv from rank 1 on world (tag 3, 64 f32)".
std::string describe_call(const FlightCall& call);
// "0.4 s", "31 s": how the records and the verdict say how long something has lasted.
std::string describe_duration(int64_t ms);
// "backward of step 812, micro-batch 2".
std::string describe_activity(const FlightActivity& activity);
// A few lines: the activity, the calls that have not ended, the last that did. SIGUSR2's
// print-out when there is no folder to write to.
std::string describe_flight_report(const FlightReport& report, int64_t now_ms);

int64_t unix_ms_now();

// The recorder of this process. Thread-safe; the calls are cheap (one short lock).
class FlightRecorder {
 public:
  static FlightRecorder& process();

  // The process's rank (the report's name), and the file writer and SIGUSR2 handler, once:
  // init_process_group and train::Trainer call it. Later calls change nothing.
  void start(int rank);

  // A communicator's call: issued now; returns its id for started() and ended().
  uint64_t issued(FlightCall call);
  void started(uint64_t id);
  void ended(uint64_t id, const std::string& error = "");
  // A communicator failed: the record is written at once.
  void failed(const std::string& error);

  void set_step(int64_t step);
  void set_micro_batch(int64_t micro_batch);
  // Sets the phase and returns the one it replaces.
  std::string set_phase(std::string_view phase);

  FlightReport report(const std::string& reason) const;

  ~FlightRecorder();

 private:
  FlightRecorder();
  struct State;
  std::unique_ptr<State> state_;
};

// `const FlightPhase phase("backward");` sets the phase for a scope and restores the one
// before it, unless an exception leaves the scope: a failure's record keeps where it
// happened.
class FlightPhase {
 public:
  explicit FlightPhase(std::string_view phase);
  ~FlightPhase();
  FlightPhase(const FlightPhase&) = delete;
  FlightPhase& operator=(const FlightPhase&) = delete;

 private:
  std::string previous_;
  int exceptions_ = 0;  // std::uncaught_exceptions() when the phase began
};

}  // namespace lockstep::comm
