// Host-to-device copies that do not make the host wait for the GPU (PyTorch's pinned-memory
// non_blocking copies, done for every copy): the bytes are copied into a pinned block on the
// host, the DMA from it is queued on the device's stream, and the block serves again only
// once an event recorded after that DMA has completed. A copy from pageable memory would
// instead make the driver wait for everything already queued on the stream, so the host could
// never run ahead of the GPU. The blocks live as long as the process, as the streams do.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace lockstep::cuda {

// Copies larger than this go the driver's way (from pageable memory, waiting): staging them
// would hold that much pinned host memory again.
inline constexpr size_t kMaxStagedCopyBytes = size_t{64} << 20;

// Queues a copy of `bytes` from host memory `src` to device memory `dst` on `stream`, whose
// GPU must be current; `src` may be reused as soon as this returns. bytes <= kMaxStagedCopyBytes.
void copy_to_device_staged(void* dst, const void* src, size_t bytes, cudaStream_t stream);

}  // namespace lockstep::cuda
