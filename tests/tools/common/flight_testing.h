// Waiting for a rank of a job under test by its flight record (lockstep/comm/flight_recorder.h),
// which says where the rank is and its pid: to stop or kill it at a known point.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "lockstep/comm/flight_recorder.h"
#include "lockstep/core/error.h"

namespace lockstep::command_testing {

// The pid of the rank whose record is `record`, once it reports step `step` or later; 0
// when it does not within about a minute.
inline pid_t wait_for_step(const std::filesystem::path& record, int64_t step) {
  for (int i = 0; i < 600; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream in(record);
    if (!in) continue;
    try {
      const comm::FlightReport report =
          comm::parse_flight_report({std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()});
      if (report.activity.step >= step) return static_cast<pid_t>(report.pid);
    } catch (const Error&) {
      // Read while it was being replaced: try again.
    }
  }
  return 0;
}

}  // namespace lockstep::command_testing
