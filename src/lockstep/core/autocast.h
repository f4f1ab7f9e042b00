// Mixed precision, the torch.autocast way: inside an AutocastGuard(DType::bf16 or f16),
// f32 matrix products (matmul, linear, and the GEMMs of conv2d, forward and backward) read
// their operands rounded to that type — on GPUs, tensor-core speed — and accumulate and
// write in f32. CPU devices round the same way and multiply the rounded values in f32 (a
// product of two bf16 or f16 values is exact in f32, as on tensor cores), which brings no
// speed but lets a CPU run what a GPU run does, its memory included. linear and matmul keep
// their activation operands for backward in that type, rounded once (ops/linalg.cpp): half
// the bytes, the same bits. Parameters (the master weights), the other activations,
// gradients and optimizer state stay f32. The setting is per thread, like NoGradGuard, and
// a CPU kernel's team computes under its caller's (core/parallel.h). f16's narrow range wants
// a loss scale (optim/loss_scaler.h); bf16 has f32's range and needs none.
#pragma once

#include "lockstep/core/dtype.h"

namespace lockstep {

// The type GPU products read their f32 operands as on this thread: f32 (off), bf16 or f16.
DType autocast_dtype();

class AutocastGuard {
 public:
  // dtype: f32 (off), bf16 or f16; anything else is an Error.
  explicit AutocastGuard(DType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DType previous_;
};

}  // namespace lockstep
