// Tensor copies and fills where a CUDA device is involved: strided_copy and Tensor::fill
// come here when either side is on a GPU. Host-to-device copies return once the host's side
// is safe to reuse, without waiting for the GPU: up to 64 MiB they go through a pinned
// staging block (pinned_staging.h) and are only queued, so the host runs ahead of the GPU;
// larger ones wait for their copy. Device-to-host copies wait (the host reads the result);
// copies between GPUs go peer to peer and only order the two devices' streams.
#pragma once

#include "lockstep/core/tensor.h"

namespace lockstep::cuda {

void copy_tensor(const Tensor& src, const Tensor& dst);
void fill_tensor(const Tensor& dst, double value);

}  // namespace lockstep::cuda
