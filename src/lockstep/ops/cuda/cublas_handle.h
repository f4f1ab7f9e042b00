// The cuBLAS handle of a logical CUDA device: one per device, made on first use and kept for
// the life of the process, queued on the device's stream (core/cuda/runtime.h) and with a
// workspace of its own, so a GEMM of a given shape picks the same algorithm, and gives the
// same bits, every run. Host code only; includes cublas_v2.h.
#pragma once

#include <cublas_v2.h>

#include "lockstep/core/device.h"

// Throws Error naming the call and cuBLAS's status.
#define LOCKSTEP_CUBLAS_CHECK(call) ::lockstep::ops::cuda::check_cublas((call), #call)

namespace lockstep::ops::cuda {

void check_cublas(cublasStatus_t status, const char* call);

// The handle for a cuda device. Call it, and use the handle, with the device's GPU current
// (cuda::OnDevice): a cuBLAS handle belongs to the GPU that was current when it was made.
cublasHandle_t cublas_handle(Device device);

}  // namespace lockstep::ops::cuda
