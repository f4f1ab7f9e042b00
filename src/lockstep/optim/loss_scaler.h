// Dynamic loss scaling for f16 training (PyTorch's GradScaler). f16 gradients below 2^-24
// flush to zero, so the loss is multiplied by a power of two S before backward; once the
// gradients are summed they are divided by S and checked. Dividing by a power of two is
// exact, so a step whose values stay in the normal range has the bits of an unscaled one.
// A step with an inf or NaN gradient is skipped and S halves; after growth_interval good
// steps in a row S doubles.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/core/tensor.h"
#include "lockstep/nn/named_tensors.h"

namespace lockstep::optim {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16, PyTorch's default; must be a power of two
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  double scale() const { return scale_; }
  // Divides each gradient by the scale, in place (any device), and returns whether every
  // element of every gradient is finite. Undefined tensors are skipped.
  bool unscale(const std::vector<Tensor>& gradients) const;
  // After a step: on a non-finite gradient (the step skipped) the scale halves and the
  // streak restarts; else, after growth_interval finite steps in a row, the scale doubles.
  void update(bool finite);

  // "loss_scale" (f64) and "loss_scale_streak" (i64): a resumed run scales as the
  // uninterrupted one would.
  NamedTensors state_dict() const;
  void load_state_dict(const NamedTensors& state);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t streak_ = 0;  // finite steps since the last change of scale
};

// Moves a LossScaler's entries ("loss_scale...") out of a state dict that also holds an
// optimizer's, and returns them (empty for a run without a scaler).
NamedTensors extract_scaler_state(NamedTensors& state);

}  // namespace lockstep::optim
