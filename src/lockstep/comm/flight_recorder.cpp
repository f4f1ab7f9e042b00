#include "lockstep/comm/flight_recorder.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "lockstep/core/error.h"

namespace lockstep::comm {

namespace {

// Enough for the calls of a few steps of a large model's buckets; a hang is explained by
// the last few.
constexpr size_t kRingCalls = 256;
// How often a changed record is written: fresh enough for a verdict a moment after a rank
// dies, cheap enough to leave on (a few KB, five times a second at most). An unchanged one
// is written again every second, so that a record that ages tells of a process that is
// stopped or frozen (the writer is a thread of its own, not held by a hung collective).
constexpr int kWriteIntervalMs = 200;
constexpr int64_t kRefreshMs = 1000;

// The writer thread's wake-up pipe; written by the SIGUSR2 handler (write is
// async-signal-safe) and by failed().
std::atomic<int> g_wake_fd{-1};

void on_dump_signal(int) {
  const int fd = g_wake_fd.load();
  if (fd >= 0) {
    const char byte = 's';
    (void)!write(fd, &byte, 1);
  }
}

}  // namespace

const char* call_state_name(CallState state) {
  switch (state) {
    case CallState::issued:
      return "issued";
    case CallState::waiting:
      return "waiting";
    case CallState::done:
      return "done";
    case CallState::failed:
      return "failed";
  }
  return "?";
}

int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// ---- the file format ----

namespace {

CallState parse_state(const std::string& name) {
  for (CallState s : {CallState::issued, CallState::waiting, CallState::done, CallState::failed}) {
    if (name == call_state_name(s)) return s;
  }
  throw Error("unknown call state '" + name.substr(0, 20) + "'");
}

}  // namespace

std::string flight_report_json(const FlightReport& r) {
  nlohmann::json calls = nlohmann::json::array();
  for (const FlightCall& c : r.calls) {
    calls.push_back({{"id", c.id},
                     {"group", c.group},
                     {"group_rank", c.group_rank},
                     {"group_size", c.group_size},
                     {"call", c.call},
                     {"sequence", c.sequence},
                     {"count", c.count},
                     {"dtype", c.dtype},
                     {"op", c.op},
                     {"peer", c.peer},
                     {"tag", c.tag},
                     {"state", call_state_name(c.state)},
                     {"issued_ms", c.issued_ms},
                     {"started_ms", c.started_ms},
                     {"ended_ms", c.ended_ms},
                     {"error", c.error}});
  }
  nlohmann::json groups = nlohmann::json::array();
  for (const FlightGroup& g : r.groups) {
    groups.push_back({{"name", g.name}, {"rank", g.rank}, {"size", g.size}, {"issued", g.issued}, {"done", g.done}});
  }
  const nlohmann::json out = {{"format", "lockstep-flight-1"},
                              {"rank", r.rank},
                              {"pid", r.pid},
                              {"reason", r.reason},
                              {"written_ms", r.written_ms},
                              {"last_progress_ms", r.last_progress_ms},
                              {"activity",
                               {{"step", r.activity.step},
                                {"micro_batch", r.activity.micro_batch},
                                {"phase", r.activity.phase},
                                {"since_ms", r.activity.since_ms}}},
                              {"failure", r.failure},
                              {"groups", groups},
                              {"calls", calls}};
  // Replacement, not an exception: an error message may hold any bytes.
  return out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

FlightReport parse_flight_report(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    LOCKSTEP_CHECK(j.value("format", "") == "lockstep-flight-1")
        << "not a flight record (format '" << j.value("format", "").substr(0, 40) << "')";
    FlightReport r;
    r.rank = j.at("rank").get<int>();
    r.pid = j.at("pid").get<int64_t>();
    r.reason = j.at("reason").get<std::string>();
    r.written_ms = j.at("written_ms").get<int64_t>();
    r.last_progress_ms = j.at("last_progress_ms").get<int64_t>();
    const nlohmann::json& a = j.at("activity");
    r.activity = {.step = a.at("step").get<int64_t>(),
                  .micro_batch = a.at("micro_batch").get<int64_t>(),
                  .phase = a.at("phase").get<std::string>(),
                  .since_ms = a.at("since_ms").get<int64_t>()};
    r.failure = j.at("failure").get<std::string>();
    for (const nlohmann::json& g : j.at("groups")) {
      r.groups.push_back({.name = g.at("name").get<std::string>(),
                          .rank = g.at("rank").get<int>(),
                          .size = g.at("size").get<int>(),
                          .issued = g.at("issued").get<uint64_t>(),
                          .done = g.at("done").get<uint64_t>()});
    }
    for (const nlohmann::json& c : j.at("calls")) {
      r.calls.push_back({.id = c.at("id").get<uint64_t>(),
                         .group = c.at("group").get<std::string>(),
                         .group_rank = c.at("group_rank").get<int>(),
                         .group_size = c.at("group_size").get<int>(),
                         .call = c.at("call").get<std::string>(),
                         .sequence = c.at("sequence").get<uint64_t>(),
                         .count = c.at("count").get<int64_t>(),
                         .dtype = c.at("dtype").get<std::string>(),
                         .op = c.at("op").get<std::string>(),
                         .peer = c.at("peer").get<int>(),
                         .tag = c.at("tag").get<int>(),
                         .state = parse_state(c.at("state").get<std::string>()),
                         .issued_ms = c.at("issued_ms").get<int64_t>(),
                         .started_ms = c.at("started_ms").get<int64_t>(),
                         .ended_ms = c.at("ended_ms").get<int64_t>(),
                         .error = c.at("error").get<std::string>()});
    }
    return r;
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("bad flight record: ") + e.what());
  }
}

std::string describe_duration(int64_t ms) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(ms < 10000 ? 1 : 0);
  out << static_cast<double>(std::max<int64_t>(0, ms)) / 1000 << " s";
  return out.str();
}

std::string describe_call(const FlightCall& c) {
  std::ostringstream out;
  const bool point_to_point = c.call == "send" || c.call == "recv";
  out << c.call;
  if (point_to_point) {
    out << (c.call == "send" ? " to" : " from") << " rank " << c.peer;
  } else {
    out << " #" << c.sequence;
  }
  out << " on " << c.group;
  if (c.call == "barrier" || c.call == "split") return out.str();
  out << " (" << c.count << " " << c.dtype;
  if (!c.op.empty()) out << ", " << c.op;
  if (c.call == "broadcast") out << ", root " << c.peer;
  if (point_to_point) out << ", tag " << c.tag;
  out << ")";
  return out.str();
}

std::string describe_activity(const FlightActivity& a) {
  // A step's own phase (its communication, between the passes) reads as the step itself.
  const bool whole_step = a.phase == "step" && a.step >= 0;
  std::string text = whole_step ? "" : a.phase;
  if (a.step >= 0) text += (whole_step ? "step " : " of step ") + std::to_string(a.step);
  if (a.micro_batch >= 0) text += ", micro-batch " + std::to_string(a.micro_batch);
  return text;
}

std::string describe_flight_report(const FlightReport& r, int64_t now_ms) {
  std::ostringstream out;
  out << "rank " << r.rank << " (pid " << r.pid << "): " << describe_activity(r.activity) << " for "
      << describe_duration(now_ms - r.activity.since_ms) << "\n";
  const FlightCall* last_ended = nullptr;
  for (const FlightCall& c : r.calls) {
    if (c.state == CallState::done || c.state == CallState::failed) {
      last_ended = &c;
      if (c.state == CallState::done) continue;
    }
    out << "  " << call_state_name(c.state) << ": " << describe_call(c);
    if (c.state == CallState::failed) {
      out << ": " << c.error.substr(0, 200);
    } else {
      out << " for " << describe_duration(now_ms - (c.started_ms > 0 ? c.started_ms : c.issued_ms));
    }
    out << "\n";
  }
  if (last_ended != nullptr && last_ended->state == CallState::done) {
    out << "  last done: " << describe_call(*last_ended) << ", " << describe_duration(now_ms - last_ended->ended_ms)
        << " ago\n";
  }
  if (!r.failure.empty()) out << "  failure: " << r.failure.substr(0, 300) << "\n";
  return out.str();
}

// ---- the recorder ----

struct FlightRecorder::State {
  mutable std::mutex mutex;
  int rank = -1;
  bool started = false;
  uint64_t next_id = 1;
  std::deque<FlightCall> ring;  // ids ring.front().id, +1, ...
  std::map<std::string, FlightGroup> groups;
  FlightActivity activity{.since_ms = unix_ms_now()};
  std::string failure;
  int64_t last_progress_ms = unix_ms_now();
  uint64_t version = 0;  // bumped by every change, so the writer knows when to write

  // The writer; its thread is never joined by a process it was not started in (a fork).
  std::string folder;
  int wake[2] = {-1, -1};
  std::thread* writer = nullptr;
  pid_t owner = 0;

  FlightCall* find(uint64_t id) {
    if (ring.empty() || id < ring.front().id) return nullptr;
    const uint64_t index = id - ring.front().id;
    return index < ring.size() ? &ring[index] : nullptr;
  }
  void changed() { ++version; }
  void write_record(const std::string& reason) const;
  void writer_loop();
};

FlightRecorder::FlightRecorder() : state_(std::make_unique<State>()) {}

FlightRecorder::~FlightRecorder() = default;

FlightRecorder& FlightRecorder::process() {
  // Never destroyed: communicators' worker threads may still record while the process exits.
  static FlightRecorder* recorder = new FlightRecorder();
  return *recorder;
}

uint64_t FlightRecorder::issued(FlightCall call) {
  State& s = *state_;
  const std::lock_guard lock(s.mutex);
  call.id = s.next_id++;
  call.state = CallState::issued;
  call.issued_ms = unix_ms_now();
  if (call.sequence > 0) {
    FlightGroup& group = s.groups[call.group];
    group.name = call.group;
    group.rank = call.group_rank;
    group.size = call.group_size;
    group.issued = std::max(group.issued, call.sequence);
  }
  s.ring.push_back(std::move(call));
  if (s.ring.size() > kRingCalls) s.ring.pop_front();
  s.changed();
  return s.next_id - 1;
}

void FlightRecorder::started(uint64_t id) {
  State& s = *state_;
  const std::lock_guard lock(s.mutex);
  if (FlightCall* call = s.find(id)) {
    call->state = CallState::waiting;
    call->started_ms = unix_ms_now();
    s.changed();
  }
}

void FlightRecorder::ended(uint64_t id, const std::string& error) {
  State& s = *state_;
  const std::lock_guard lock(s.mutex);
  const int64_t now = unix_ms_now();
  if (error.empty()) s.last_progress_ms = now;
  if (FlightCall* call = s.find(id)) {
    call->state = error.empty() ? CallState::done : CallState::failed;
    call->ended_ms = now;
    call->error = error;
    if (call->sequence > 0 && error.empty()) {
      FlightGroup& group = s.groups[call->group];
      group.done = std::max(group.done, call->sequence);
    }
  }
  s.changed();
}

void FlightRecorder::failed(const std::string& error) {
  State& s = *state_;
  {
    const std::lock_guard lock(s.mutex);
    if (!s.failure.empty()) return;
    s.failure = error;
    s.changed();
  }
  if (s.wake[1] >= 0) {
    const char byte = 'f';
    (void)!write(s.wake[1], &byte, 1);
  }
}

void FlightRecorder::set_step(int64_t step) {
  State& s = *state_;
  const std::lock_guard lock(s.mutex);
  s.activity.step = step;
  s.activity.micro_batch = -1;
  s.changed();
}

void FlightRecorder::set_micro_batch(int64_t micro_batch) {
  State& s = *state_;
  const std::lock_guard lock(s.mutex);
  s.activity.micro_batch = micro_batch;
  s.changed();
}

std::string FlightRecorder::set_phase(std::string_view phase) {
  State& s = *state_;
  const std::lock_guard lock(s.mutex);
  std::string previous = std::move(s.activity.phase);
  s.activity.phase = phase;
  s.activity.since_ms = s.last_progress_ms = unix_ms_now();
  s.changed();
  return previous;
}

FlightReport FlightRecorder::report(const std::string& reason) const {
  const State& s = *state_;
  const std::lock_guard lock(s.mutex);
  FlightReport r;
  r.rank = s.rank;
  r.pid = getpid();
  r.reason = reason;
  r.written_ms = unix_ms_now();
  r.last_progress_ms = s.last_progress_ms;
  r.activity = s.activity;
  r.failure = s.failure;
  for (const auto& [name, group] : s.groups) r.groups.push_back(group);
  r.calls.assign(s.ring.begin(), s.ring.end());
  return r;
}

void FlightRecorder::State::write_record(const std::string& reason) const {
  // The report is taken under the lock by report(); this runs on the writer thread.
  const FlightReport r = FlightRecorder::process().report(reason);
  if (folder.empty()) {
    const std::string text = describe_flight_report(r, unix_ms_now());
    std::fprintf(stderr, "lockstep flight record (SIGUSR2): %s", text.c_str());
    return;
  }
  const std::filesystem::path path = std::filesystem::path(folder) / ("rank" + std::to_string(r.rank) + ".flight.json");
  const std::filesystem::path temporary = path.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << flight_report_json(r);
    if (!out) return;  // a full disk loses a record, never the run
  }
  std::error_code ignored;
  std::filesystem::rename(temporary, path, ignored);
}

void FlightRecorder::State::writer_loop() {
  uint64_t written = ~uint64_t{0};
  int64_t written_ms = 0;
  for (;;) {
    pollfd fd{wake[0], POLLIN, 0};
    const int ready = poll(&fd, 1, kWriteIntervalMs);
    bool signalled = false, failure = false, quit = false;
    if (ready > 0) {
      char bytes[64];
      const ssize_t n = read(wake[0], bytes, sizeof(bytes));
      for (ssize_t i = 0; i < n; ++i) {
        signalled |= bytes[i] == 's';
        failure |= bytes[i] == 'f';
        quit |= bytes[i] == 'q';
      }
    }
    uint64_t now_version;
    {
      const std::lock_guard lock(mutex);
      now_version = version;
    }
    const int64_t now_ms = unix_ms_now();
    if (signalled) {
      write_record("signal");
    } else if (!folder.empty() && (quit || failure || now_version != written || now_ms - written_ms >= kRefreshMs)) {
      write_record(quit ? "exit" : failure ? "failure" : "running");
      written_ms = now_ms;
    }
    written = now_version;
    if (quit) return;
  }
}

void FlightRecorder::start(int rank) {
  State& s = *state_;
  {
    const std::lock_guard lock(s.mutex);
    if (s.started) return;
    s.started = true;
    s.rank = rank;
    if (const char* folder = std::getenv("LOCKSTEP_FLIGHT_DIR"); folder != nullptr && *folder != '\0') {
      s.folder = folder;
    }
  }
  if (!s.folder.empty()) {
    std::error_code error;
    std::filesystem::create_directories(s.folder, error);
  }
  if (pipe2(s.wake, O_CLOEXEC | O_NONBLOCK) != 0) return;  // no writer: the ring is still kept
  s.owner = getpid();
  g_wake_fd.store(s.wake[1]);
  s.writer = new std::thread([&s] { s.writer_loop(); });
  struct sigaction action {};
  action.sa_handler = on_dump_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &action, nullptr);
  // At exit the last state is written and the thread joined, in the process that started
  // it only: a forked child has the thread object but not the thread.
  std::atexit([] {
    State& state = *FlightRecorder::process().state_;
    if (state.writer == nullptr || state.owner != getpid()) return;
    const char byte = 'q';
    (void)!write(state.wake[1], &byte, 1);
    state.writer->join();
    delete state.writer;
    state.writer = nullptr;
  });
}

FlightPhase::FlightPhase(std::string_view phase)
    : previous_(FlightRecorder::process().set_phase(phase)), exceptions_(std::uncaught_exceptions()) {}

FlightPhase::~FlightPhase() {
  if (std::uncaught_exceptions() == exceptions_) FlightRecorder::process().set_phase(previous_);
}

}  // namespace lockstep::comm
