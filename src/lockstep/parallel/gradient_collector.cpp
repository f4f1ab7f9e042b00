#include "lockstep/parallel/gradient_collector.h"

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/core/error.h"
#include "lockstep/ops/ops.h"

namespace lockstep::parallel {

GradientCollector::GradientCollector(const FlatGradients& layout, bool hooks)
    : layout_(layout), buffer_(layout.empty_buffer()), taken_(layout.params().size(), false), hooks_(hooks) {
  const std::vector<Tensor>& params = layout_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    LOCKSTEP_CHECK(!params[i].grad().defined())
        << "GradientCollector: parameter " << i << " has a .grad already; the step's gradients start from none";
    params[i].set_grad_destination(place(i));
    if (hooks_) params[i].set_post_accumulate_grad_hook([this, i] { take(i); });
  }
}

GradientCollector::~GradientCollector() { release(); }

void GradientCollector::take(size_t i) {
  const Tensor& p = layout_.params()[i];
  const Tensor g = p.grad();
  if (!g.defined()) return;
  const Tensor where = place(i);
  if (!taken_[i]) {
    // A gradient computed in its place (the destination) is there already.
    if (g.data_ptr() != where.data_ptr()) where.copy_from(g);
    taken_[i] = true;
  } else {
    // A second pass reached it (activation checkpointing recomputes in passes of its own):
    // add, as backward would have added into .grad.
    NoGradGuard no_grad;
    where.copy_from(add(where, g));
  }
  p.set_grad(Tensor());
}

Tensor GradientCollector::finish() {
  release();
  for (size_t i = 0; i < taken_.size(); ++i) {
    if (!taken_[i]) place(i).zero();
  }
  layout_.zero_padding(buffer_);
  return buffer_;
}

void GradientCollector::release() {
  if (!active_) return;
  active_ = false;
  for (const Tensor& p : layout_.params()) {
    if (hooks_) p.set_post_accumulate_grad_hook(nullptr);
    p.set_grad_destination(Tensor());
  }
}

}  // namespace lockstep::parallel
