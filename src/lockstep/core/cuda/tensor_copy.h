// Tensor copies and fills where a CUDA device is involved: strided_copy and Tensor::fill
// come here when either side is on a GPU. Host<->device copies return once the host's side
// is safe to reuse (like PyTorch's non_blocking=False); copies between GPUs go peer to peer
// and only order the two devices' streams, without a host wait.
#pragma once

#include "lockstep/core/tensor.h"

namespace lockstep::cuda {

void copy_tensor(const Tensor& src, const Tensor& dst);
void fill_tensor(const Tensor& dst, double value);

}  // namespace lockstep::cuda
