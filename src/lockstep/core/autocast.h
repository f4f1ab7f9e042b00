// Mixed precision, the torch.autocast way: inside an AutocastGuard(DType::bf16 or f16),
// f32 matrix products on GPUs (matmul, linear, and the GEMMs of conv2d, forward and
// backward) read their operands rounded to that type — tensor-core speed — and accumulate
// and write in f32. Parameters (the master weights), activations between the products,
// gradients and optimizer state stay f32. The setting is per thread, like NoGradGuard; CPU
// devices ignore it (they compute in f32). f16's narrow range wants a loss scale
// (optim/loss_scaler.h); bf16 has f32's range and needs none.
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
