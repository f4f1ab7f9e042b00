#include "lockstep/obs/chrome_trace.h"

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "lockstep/core/error.h"

namespace lockstep {

ChromeTrace::ChromeTrace(const std::string& path) : path_(path), file_(std::fopen(path.c_str(), "w")) {
  LOCKSTEP_CHECK(file_ != nullptr) << "cannot write the trace " << path << ": " << std::strerror(errno);
  LOCKSTEP_CHECK(std::fputs("[\n", file_) >= 0) << "cannot write the trace " << path << ": " << std::strerror(errno);
}

ChromeTrace::~ChromeTrace() {
  if (file_ == nullptr) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
}

void ChromeTrace::name_track(int track, const std::string& name) {
  write(nlohmann::json{{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", track}, {"args", {{"name", name}}}}
            .dump());
}

void ChromeTrace::span(int track, const std::string& name, double start_seconds, double duration_seconds) {
  // Microseconds, the format's unit.
  write(nlohmann::json{{"ph", "X"},
                       {"name", name},
                       {"pid", 0},
                       {"tid", track},
                       {"ts", start_seconds * 1e6},
                       {"dur", duration_seconds * 1e6}}
            .dump());
}

void ChromeTrace::write(const std::string& event) {
  const std::string line = (first_ ? "" : ",\n") + event;
  first_ = false;
  LOCKSTEP_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size())
      << "cannot write the trace " << path_ << ": " << std::strerror(errno);
}

}  // namespace lockstep
