// Whether kernels on one GPU may read another GPU's memory (peer access), turned on where
// the topology allows: copies between GPUs then go over NVLink or PCIe directly, and a
// kernel can fold another device's tensors where they lie instead of a copy of them.
#pragma once

namespace lockstep::cuda {

// True when kernels running on GPU `reader` (a CUDA device ordinal) can dereference memory
// allocated on GPU `owner`: the same GPU, or peer access, which the first call for the pair
// enables (it lasts as long as the process). False where the GPUs cannot reach each other
// that way; cudaMemcpyPeerAsync still copies between them, staged by the driver.
bool can_read_peer_memory(int reader, int owner);

}  // namespace lockstep::cuda
