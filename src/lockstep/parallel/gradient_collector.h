// One backward pass's gradients, straight into one flat buffer (FlatGradients' order): each
// parameter's gradient moves into its place the moment backward finishes it (a
// post-accumulate hook), and a linear layer writes its weight's there directly (a grad
// destination). So the parameters' .grad tensors never all exist beside the buffer: a step
// peaks at the buffer plus one gradient in flight, not at twice the gradients — 16 bytes
// per parameter for fp32 AdamW instead of 20. The values are the ones backward computed,
// copied exactly, so the bits do not change.
#pragma once

#include <vector>

#include "lockstep/core/tensor.h"
#include "lockstep/parallel/flat_gradients.h"

namespace lockstep::parallel {

class GradientCollector {
 public:
  // For the next backward pass over `layout`'s parameters, which must have no .grad. With
  // `hooks`, the collector installs their post-accumulate hooks (replacing any, removed when
  // it ends); without, the caller's own hooks call take().
  explicit GradientCollector(const FlatGradients& layout, bool hooks = true);
  ~GradientCollector();
  GradientCollector(const GradientCollector&) = delete;
  GradientCollector& operator=(const GradientCollector&) = delete;

  // Moves parameter i's finished gradient into its place (what the hook does).
  void take(size_t i);
  // After backward: the buffer, with zeros for the parameters backward did not reach (and
  // the padding). The hooks are gone afterwards.
  Tensor finish();

 private:
  Tensor place(size_t i) const { return layout_.view(buffer_, i); }
  void release();

  const FlatGradients& layout_;
  Tensor buffer_;
  std::vector<bool> taken_;
  bool hooks_ = true;
  bool active_ = true;
};

}  // namespace lockstep::parallel
