#include "lockstep/parallel/flat_gradients.h"

namespace lockstep::parallel {
namespace {

Tensor view_at(const Tensor& flat, const Shape& shape, int64_t offset) {
  return flat.as_strided(shape, contiguous_strides(shape), offset);
}

}  // namespace

FlatGradients::FlatGradients(std::vector<Tensor> params) : params_(std::move(params)), offsets_(params_.size()) {
  LOCKSTEP_CHECK(!params_.empty()) << "data parallelism needs a model with parameters";
  for (size_t i = params_.size(); i-- > 0;) {
    const Tensor& p = params_[i];
    LOCKSTEP_CHECK(p.dtype() == params_.front().dtype() && p.device() == params_.front().device())
        << "data parallelism needs parameters of one dtype and device (their gradients travel as one buffer); "
           "parameter "
        << i << " is " << dtype_name(p.dtype()) << " on " << p.device().str() << ", parameter 0 "
        << dtype_name(params_.front().dtype()) << " on " << params_.front().device().str();
    offsets_[i] = numel_;
    numel_ += p.numel();
  }
}

Tensor FlatGradients::empty_buffer() const {
  return Tensor::empty({numel_}, params_.front().dtype(), params_.front().device());
}

void FlatGradients::take(size_t i, const Tensor& flat) const {
  const Tensor& p = params_[i];
  const Tensor view = view_at(flat, p.shape(), offsets_[i]);
  const Tensor g = p.grad();
  if (g.defined()) {
    view.copy_from(g);
  } else {
    view.zero();
  }
  p.set_grad(Tensor());
}

Tensor FlatGradients::take_all() const {
  const Tensor flat = empty_buffer();
  for (size_t i = 0; i < params_.size(); ++i) take(i, flat);
  return flat;
}

void FlatGradients::give(const Tensor& flat) const {
  for (size_t i = 0; i < params_.size(); ++i) params_[i].set_grad(view_at(flat, params_[i].shape(), offsets_[i]));
}

}  // namespace lockstep::parallel
