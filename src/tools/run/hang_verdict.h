// Which rank holds a job back, and where: `lockstep run`'s one-message verdict when a
// worker fails or the job stops making progress, from the flight records its ranks write
// (lockstep/comm/flight_recorder.h). PyTorch's flight recorder needs an analysis script;
// this is the analysis, done by the launcher.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/comm/flight_recorder.h"

namespace lockstep::tools {

// DIR/rank<r>.flight.json for r in [first_rank, first_rank + workers): a rank without a
// readable record (not a Lockstep program, not started yet, a torn file) has none.
std::vector<std::optional<comm::FlightReport>> read_flight_reports(const std::string& dir, int first_rank, int workers);

// The newest progress any rank reported (a call that ended, a phase that began); 0 when no
// rank wrote a record.
int64_t newest_progress_ms(const std::vector<std::optional<comm::FlightReport>>& reports);

// One line: the failed rank (failed_rank >= 0, with how it ended), the ranks that hold the
// others back and what they are doing, the collectives the others wait in and for how
// long. reports[i] is rank first_rank + i's (a node of a multi-node job sees its own). For
// example: "rank 1 holds the others back: it is in
// backward of step 812, micro-batch 2, for 31 s; ranks 0, 2, 3 wait in all_reduce #4411
// on world (1000 f32, sum) for 31 s". Empty when no rank wrote a record.
std::string hang_verdict(const std::vector<std::optional<comm::FlightReport>>& reports, int failed_rank,
                         const std::string& failure, int64_t now_ms, int first_rank = 0);

}  // namespace lockstep::tools
