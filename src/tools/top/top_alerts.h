// The alerts `lockstep top` raises in its view and its log: a job whose GPUs are far apart
// in utilization (load imbalance), memory nearly full, thermal or power throttling, Xid errors.
//
// "One job" is every GPU holding a process with the same user and the same command line
// (the workers that torchrun, mpirun or `lockstep run` start share their command). Processes
// from another PID namespace have no known command and join no job.
#pragma once

#include <vector>

#include "lockstep/gpu/gpu_state.h"
#include "tools/top/top_sample.h"

namespace lockstep::tools {

struct AlertRules {
  double memory_fraction = 0.95;   // memory used / total above this alerts
  unsigned imbalance_points = 30;  // max - min utilization of one job's GPUs, at or above this alerts
};

std::vector<Alert> find_alerts(const gpu::GpuState& state, const AlertRules& rules = {});

// An "xid" alert per GPU the kernel log reports Xid errors for: how many, the last one and
// what it means (gpu/xid_log.h's catalog).
std::vector<Alert> xid_alerts(const TopSample& sample);

}  // namespace lockstep::tools
