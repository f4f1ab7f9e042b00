// A timeline in the Chrome trace event format (JSON array of complete "X" events), which
// Perfetto (ui.perfetto.dev) and chrome://tracing open. Events are written as they come,
// one per line, so a crashed run still leaves a readable trace: the closing bracket is
// optional in this format.
#pragma once

#include <cstdio>
#include <string>

namespace lockstep {

class ChromeTrace {
 public:
  explicit ChromeTrace(const std::string& path);  // truncates; Error naming the path if it cannot
  ~ChromeTrace();
  ChromeTrace(const ChromeTrace&) = delete;
  ChromeTrace& operator=(const ChromeTrace&) = delete;

  // Names track `track` (a row in the viewer), e.g. "cpu:1".
  void name_track(int track, const std::string& name);
  // One span on a track; times in seconds from the trace's start.
  void span(int track, const std::string& name, double start_seconds, double duration_seconds);

 private:
  void write(const std::string& event);

  std::string path_;
  FILE* file_;
  bool first_ = true;
};

}  // namespace lockstep
