// What the CUDA versions say when no GPU can be used: the CUDA version the driver supports
// (cudaDriverGetVersion: 1000 * major + 10 * minor, 0 when no driver is loaded) against the
// one of the runtime this build carries. A driver older than the runtime is the usual cause
// of "no GPU" on a server that has GPUs, and the error CUDA gives does not say which
// versions it compared.
#pragma once

#include <string>

namespace lockstep::cuda {

// "12.4" for 12040.
std::string cuda_version_text(int version);
// One sentence for the message that says why there is no CUDA device: no driver, a driver
// too old for the runtime (with both versions and the fix), or both versions when they do
// not explain it.
std::string explain_cuda_versions(int driver_version, int runtime_version);

}  // namespace lockstep::cuda
