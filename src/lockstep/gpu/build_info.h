// What this build of Lockstep was compiled against: the CUDA runtime and NCCL versions
// (0 when built without CUDA) and whether the mpi backend is in. `lockstep doctor` compares
// them with what the host's driver supports.
#pragma once

#include <string>

namespace lockstep::gpu {

struct BuildInfo {
  int cuda_runtime_version = 0;  // CUDART_VERSION: 12040 for 12.4; 0 = built without CUDA
  int nccl_version = 0;          // NCCL_VERSION_CODE of nccl.h: 22809 for 2.28.9; 0 = no NCCL
  // NCCL is linked against the same CUDA runtime (one runtime per process), so it needs a
  // driver that supports this CUDA version too.
  int nccl_cuda_version = 0;
  int nccl_library_version = 0;  // ncclGetVersion of the library loaded at run time; 0 = unknown
  bool mpi = false;              // the `mpi` comm backend is compiled in (LOCKSTEP_HAVE_MPI)
};

// This binary's BuildInfo.
BuildInfo build_info();

// "12.4" from 12040 (CUDA's encoding: 1000 * major + 10 * minor); "none" for 0.
std::string cuda_version_string(int version);
// "2.28.9" from 22809 (NCCL >= 2.9 encodes 10000 * major + 100 * minor + patch; older
// releases 1000 * major + 100 * minor + patch); "none" for 0.
std::string nccl_version_string(int version);

}  // namespace lockstep::gpu
