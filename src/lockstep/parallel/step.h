// What every data-parallel layout shares: the layouts a step's tree can take, and what a
// step reports (its loss and where each device's time went).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::parallel {

// Where one device's time in a step went, in seconds.
struct DeviceTimes {
  double started = 0;      // when the device began the step, on the steady clock
  double compute = 0;      // forward, backward and folding its micro-batches
  double wait = 0;         // at the all-reduce, until the slowest device arrived
  double communicate = 0;  // the all-reduce itself (with overlap: the part backward did not hide)
  double optimizer = 0;    // the optimizer step
};

struct StepResult {
  double loss = 0;  // mean cross-entropy over the global batch, summed in tree order
  std::vector<DeviceTimes> devices;
};

// "" when `devices` devices can share a step of `batch` samples in micro-batches of
// `micro_batch` as the step's tree needs (equal power-of-two runs of micro-batches), else
// the error, with the arithmetic and what would work.
std::string check_step_layout(int64_t batch, int64_t micro_batch, int devices);

}  // namespace lockstep::parallel
