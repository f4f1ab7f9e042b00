// The rows `lockstep bench collectives` prints: nccl-tests' columns (size, count, type,
// redop, time, algbw, busbw, #wrong) plus eta where the in-place update bandwidth was
// measured, and a reference's time, bus bandwidth and our speedup over it where one ran in
// the same run (MPI's collectives, or NCCL's own reductions beside the tree order).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/bench/collective_timing.h"

namespace lockstep::tools {

struct Row {
  Collective what = Collective::all_reduce;
  int64_t bytes = 0;
  Timing ours;
  double reference_seconds = 0;  // 0: not compared
  int64_t reference_wrong = -1;  // the reference's wrong elements (-1: not checked)
};

// What every row of one run shares.
struct RowSettings {
  std::string backend;
  std::string route;  // how the backend's collectives go, when it says ("" otherwise)
  int ranks = 1;
  DType dtype = DType::f32;
  std::string op = "sum";
  int64_t iters = 0, warmup = 0;
  std::string reference;        // "mpi", "nccl" or "" (none)
  double update_bandwidth = 0;  // bytes/s of the in-place update (eta's bound); 0: not measured
};

// One row as JSON: collective, backend, route, ranks, size, count, type, redop, time_us,
// algbw, busbw, wrong, eta (all_reduce with an update bandwidth), and, compared,
// <reference>_time_us, <reference>_busbw, <reference>_wrong (where it was checked) and
// speedup (the reference's time over ours).
nlohmann::json row_json(const Row& row, const RowSettings& settings);

// The table, its header naming the run and its last line how the bandwidths are defined.
std::string rows_table(const std::vector<Row>& rows, const RowSettings& settings);

}  // namespace lockstep::tools
