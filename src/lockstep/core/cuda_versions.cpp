#include "lockstep/core/cuda_versions.h"

namespace lockstep::cuda {

std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

std::string explain_cuda_versions(int driver_version, int runtime_version) {
  const std::string runtime = "CUDA " + cuda_version_text(runtime_version);
  if (driver_version <= 0) {
    return "no NVIDIA driver is loaded (cudaDriverGetVersion gives 0; this build's runtime is " + runtime +
           "): install the driver, or in a container start it with the GPUs (--gpus all) so /dev/nvidia* exist";
  }
  const std::string driver = "CUDA " + cuda_version_text(driver_version);
  if (driver_version < runtime_version) {
    return "the driver supports up to " + driver + " and this build's runtime is " + runtime +
           ": install a driver for " + runtime + " or newer (nvidia-smi shows the driver's CUDA version)";
  }
  return "the driver supports up to " + driver + ", this build's runtime is " + runtime;
}

}  // namespace lockstep::cuda
