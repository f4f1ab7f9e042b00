#include "lockstep/parallel/flat_gradients.h"

#include "lockstep/ops/ops.h"

namespace lockstep::parallel {
namespace {

Tensor view_at(const Tensor& flat, const Shape& shape, int64_t offset) {
  return flat.as_strided(shape, contiguous_strides(shape), offset);
}

}  // namespace

FlatGradients::FlatGradients(std::vector<Tensor> params, int shards, const std::vector<size_t>& unit_sizes)
    : params_(std::move(params)), offsets_(params_.size()), shards_(shards) {
  LOCKSTEP_CHECK(!params_.empty()) << "data parallelism needs a model with parameters";
  LOCKSTEP_CHECK(shards >= 1) << "a buffer cuts into at least one shard, got " << shards;
  std::vector<size_t> sizes = unit_sizes.empty() ? std::vector<size_t>{params_.size()} : unit_sizes;
  size_t total = 0;
  for (size_t size : sizes) {
    LOCKSTEP_CHECK(size >= 1) << "every unit of a flat buffer holds at least one parameter";
    total += size;
  }
  LOCKSTEP_CHECK(total == params_.size())
      << "the units hold " << total << " parameters, the model has " << params_.size();
  size_t next = params_.size();  // buffer order: the last parameter first
  for (size_t size : sizes) {
    FlatUnit unit{.begin = padded_, .end = padded_, .params = {}};
    for (size_t k = 0; k < size; ++k) {
      const size_t i = --next;
      const Tensor& p = params_[i];
      LOCKSTEP_CHECK(p.dtype() == params_.front().dtype() && p.device() == params_.front().device())
          << "data parallelism needs parameters of one dtype and device (their gradients travel as one buffer); "
             "parameter "
          << i << " is " << dtype_name(p.dtype()) << " on " << p.device().str() << ", parameter 0 "
          << dtype_name(params_.front().dtype()) << " on " << params_.front().device().str();
      offsets_[i] = unit.end;
      unit.end += p.numel();
      numel_ += p.numel();
      unit.params.push_back(i);
    }
    unit.params_end = unit.end;
    unit.end = unit.begin + (unit.end - unit.begin + shards - 1) / shards * shards;
    padded_ = unit.end;
    units_.push_back(std::move(unit));
  }
}

Tensor FlatGradients::empty_buffer() const {
  const Tensor flat = Tensor::empty({padded_}, params_.front().dtype(), params_.front().device());
  zero_padding(flat);
  return flat;
}

void FlatGradients::zero_padding(const Tensor& flat) const {
  for (const FlatUnit& unit : units_) {
    if (unit.params_end < unit.end) slice(flat, 0, unit.params_end, unit.end).zero();
  }
}

Tensor FlatGradients::view(const Tensor& flat, size_t i, int64_t begin) const {
  return view_at(flat, params_[i].shape(), flat.offset() + offsets_[i] - begin);
}

Tensor FlatGradients::gather_values() const {
  const Tensor flat = empty_buffer();
  for (size_t i = 0; i < params_.size(); ++i) view(flat, i).copy_from(params_[i]);
  return flat;
}

void FlatGradients::take(size_t i, const Tensor& flat, int64_t begin) const {
  const Tensor& p = params_[i];
  const Tensor place = view(flat, i, begin);
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
