#include "lockstep/gpu/build_info.h"

#ifdef LOCKSTEP_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace lockstep::gpu {

BuildInfo build_info() {
  BuildInfo info;
#ifdef LOCKSTEP_HAVE_NCCL
  info.cuda_runtime_version = CUDART_VERSION;
  info.nccl_version = NCCL_VERSION_CODE;
  info.nccl_cuda_version = CUDART_VERSION;
  // Needs no GPU or driver: it reports the version compiled into the loaded libnccl.
  int loaded = 0;
  if (ncclGetVersion(&loaded) == ncclSuccess) info.nccl_library_version = loaded;
#endif
#ifdef LOCKSTEP_HAVE_MPI
  info.mpi = true;
#endif
  return info;
}

std::string cuda_version_string(int version) {
  if (version <= 0) return "none";
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

std::string nccl_version_string(int version) {
  if (version <= 0) return "none";
  const int major = version >= 10000 ? version / 10000 : version / 1000;
  const int minor = version >= 10000 ? version % 10000 / 100 : version % 1000 / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(version % 100);
}

}  // namespace lockstep::gpu
