// A timeline in the Chrome trace event format (JSON array of complete "X" events), which
// Perfetto (ui.perfetto.dev) and chrome://tracing open. Events are written as they come,
// one per line, so a crashed run still leaves a readable trace: the closing bracket is
// optional in this format.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace lockstep {

class ChromeTrace {
 public:
  // Truncates; Error naming the path if it cannot. `process`: the process row the tracks
  // belong to (a rank of a job whose ranks' traces are merged).
  explicit ChromeTrace(const std::string& path, int process = 0);
  ~ChromeTrace();  // close()s
  ChromeTrace(const ChromeTrace&) = delete;
  ChromeTrace& operator=(const ChromeTrace&) = delete;

  // Names the process row ("rank 1") and track `track` (a row in it), e.g. "cpu:1".
  void name_process(const std::string& name);
  void name_track(int track, const std::string& name);
  // One span on a track; times in seconds from the trace's start; step >= 0 shows with it.
  void span(int track, const std::string& name, double start_seconds, double duration_seconds, int64_t step = -1);
  // Appends the events of another closed trace file (another rank's), then removes it.
  void merge(const std::string& other_path);
  // Ends the file; later calls write nothing.
  void close();

 private:
  void write(const std::string& event);

  std::string path_;
  int process_;
  FILE* file_;
  bool first_ = true;
};

}  // namespace lockstep
