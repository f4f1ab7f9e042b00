// Who runs a process NVML lists on a GPU: its user and command line, from /proc. NVML gives
// host PIDs, so inside a container with its own PID namespace /proc may not know them; the
// process is then marked as outside this namespace rather than shown with blank columns.
#pragma once

#include <string>

#include "lockstep/gpu/gpu_state.h"

namespace lockstep::gpu {

// Fills uid, user, command and in_this_namespace of `process` from <proc_root>/<pid>/.
// A uid with no entry in the password database keeps `user` empty (tools print the uid).
void fill_process_details(GpuProcess& process, const std::string& proc_root = "/proc");

}  // namespace lockstep::gpu
