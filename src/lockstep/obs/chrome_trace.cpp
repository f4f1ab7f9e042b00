#include "lockstep/obs/chrome_trace.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lockstep/core/error.h"

namespace lockstep {

ChromeTrace::ChromeTrace(const std::string& path, int process)
    : path_(path), process_(process), file_(std::fopen(path.c_str(), "w")) {
  LOCKSTEP_CHECK(file_ != nullptr) << "cannot write the trace " << path << ": " << std::strerror(errno);
  LOCKSTEP_CHECK(std::fputs("[\n", file_) >= 0) << "cannot write the trace " << path << ": " << std::strerror(errno);
}

ChromeTrace::~ChromeTrace() { close(); }

void ChromeTrace::close() {
  if (file_ == nullptr) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

void ChromeTrace::name_process(const std::string& name) {
  write(nlohmann::json{{"ph", "M"}, {"name", "process_name"}, {"pid", process_}, {"args", {{"name", name}}}}.dump());
}

void ChromeTrace::name_track(int track, const std::string& name) {
  write(nlohmann::json{
      {"ph", "M"}, {"name", "thread_name"}, {"pid", process_}, {"tid", track}, {"args", {{"name", name}}}}
            .dump());
}

void ChromeTrace::span(int track, const std::string& name, double start_seconds, double duration_seconds,
                       int64_t step) {
  // Microseconds, the format's unit.
  nlohmann::json event = {{"ph", "X"},
                          {"name", name},
                          {"pid", process_},
                          {"tid", track},
                          {"ts", start_seconds * 1e6},
                          {"dur", duration_seconds * 1e6}};
  if (step >= 0) event["args"] = {{"step", step}};
  write(event.dump());
}

void ChromeTrace::merge(const std::string& other_path) {
  std::ifstream in(other_path);
  LOCKSTEP_CHECK(in.good()) << "cannot read the trace " << other_path << " to merge it into " << path_;
  for (std::string line; std::getline(in, line);) {
    // One event per line, each but the first after a ",\n"; the brackets on their own lines.
    if (!line.empty() && line.back() == ',') line.pop_back();
    if (line.empty() || line == "[" || line == "]") continue;
    write(line);
  }
  in.close();
  std::remove(other_path.c_str());
}

void ChromeTrace::write(const std::string& event) {
  if (file_ == nullptr) return;
  const std::string line = (first_ ? "" : ",\n") + event;
  first_ = false;
  LOCKSTEP_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size())
      << "cannot write the trace " << path_ << ": " << std::strerror(errno);
}

}  // namespace lockstep
