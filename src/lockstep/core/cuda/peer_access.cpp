#include "lockstep/core/cuda/peer_access.h"

#include <map>
#include <mutex>
#include <utility>

#include "lockstep/core/cuda/runtime.h"

namespace lockstep::cuda {

bool can_read_peer_memory(int reader, int owner) {
  if (reader == owner) return true;
  static std::mutex mutex;
  static auto* known = new std::map<std::pair<int, int>, bool>();  // never freed: lasts as peer access does
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = known->find({reader, owner});
  if (found != known->end()) return found->second;
  bool enabled = false;
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, reader, owner) != cudaSuccess || !can) {
    cudaGetLastError();
  } else {
    int previous = 0;
    LOCKSTEP_CUDA_CHECK(cudaGetDevice(&previous));
    LOCKSTEP_CUDA_CHECK(cudaSetDevice(reader));  // peer access is enabled from the reader's context
    const cudaError_t rc = cudaDeviceEnablePeerAccess(owner, 0);
    enabled = rc == cudaSuccess || rc == cudaErrorPeerAccessAlreadyEnabled;
    if (rc != cudaSuccess) cudaGetLastError();
    cudaSetDevice(previous);
  }
  known->emplace(std::make_pair(reader, owner), enabled);
  return enabled;
}

}  // namespace lockstep::cuda
