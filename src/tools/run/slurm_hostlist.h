// Slurm's compressed host lists ("node[01-04,07],gpu3"), as SLURM_JOB_NODELIST and
// SLURM_STEP_NODELIST give them: the first host is where rank 0 runs (block distribution,
// Slurm's default), the address PyTorch's env:// rendezvous needs as MASTER_ADDR.
#pragma once

#include <string>

namespace lockstep::tools {

// The list's first host: "node[01-04,07],gpu3" -> "node01", "a,b" -> "a",
// "r[1-2]-n[08-09]" -> "r1-n08". UsageError naming the variable for an empty or unbalanced
// list.
std::string first_slurm_host(const std::string& list, const std::string& variable);

}  // namespace lockstep::tools
