#include "lockstep/parallel/flat_gradients.h"

#include "lockstep/ops/ops.h"

namespace lockstep::parallel {
namespace {

Tensor view_at(const Tensor& flat, const Shape& shape, int64_t offset) {
  return flat.as_strided(shape, contiguous_strides(shape), offset);
}

}  // namespace

FlatGradients::FlatGradients(std::vector<Tensor> params, int shards)
    : params_(std::move(params)), offsets_(params_.size()) {
  LOCKSTEP_CHECK(!params_.empty()) << "data parallelism needs a model with parameters";
  LOCKSTEP_CHECK(shards >= 1) << "a buffer cuts into at least one shard, got " << shards;
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
  padded_ = (numel_ + shards - 1) / shards * shards;
}

Tensor FlatGradients::empty_buffer() const {
  const Tensor flat = Tensor::empty({padded_}, params_.front().dtype(), params_.front().device());
  if (padded_ > numel_) slice(flat, 0, numel_, padded_).zero();
  return flat;
}

Tensor FlatGradients::view(const Tensor& flat, size_t i) const {
  return view_at(flat, params_[i].shape(), flat.offset() + offsets_[i]);
}

Tensor FlatGradients::gather_values() const {
  const Tensor flat = empty_buffer();
  for (size_t i = 0; i < params_.size(); ++i) view(flat, i).copy_from(params_[i]);
  return flat;
}

void FlatGradients::take(size_t i, const Tensor& flat) const {
  const Tensor& p = params_[i];
  const Tensor place = view(flat, i);
  const Tensor g = p.grad();
  if (g.defined()) {
    // A gradient computed in its place (Tensor::set_grad_destination) is there already.
    if (g.data_ptr() != place.data_ptr() || g.shape() != place.shape() || !g.is_contiguous()) place.copy_from(g);
  } else {
    place.zero();
  }
  p.set_grad(Tensor());
}

void FlatGradients::give(const Tensor& flat) const {
  for (size_t i = 0; i < params_.size(); ++i) params_[i].set_grad(view(flat, i));
}

}  // namespace lockstep::parallel
