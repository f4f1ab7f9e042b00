// Tensor members that copy: contiguous, clone, to(dtype), to(device). Each records a
// backward that hands the gradient back in the input's dtype and device.
#include "lockstep/autograd/node.h"
#include "lockstep/core/tensor.h"

namespace lockstep {
namespace {

Tensor copy_as(const Tensor& x, DType dtype, Device device) {
  Tensor out = Tensor::empty(x.shape(), dtype, device);
  out.copy_from(x);
  return out;
}

Tensor recorded_copy(const char* name, const Tensor& x, DType dtype, Device device) {
  Tensor out = copy_as(x, dtype, device);
  const DType in_dtype = x.dtype();
  const Device in_device = x.device();
  autograd::record(name, {x}, {out}, [in_dtype, in_device](const std::vector<Tensor>& g) {
    const Tensor& grad = g[0];
    if (grad.dtype() == in_dtype && grad.device() == in_device) return std::vector<Tensor>{grad};
    return std::vector<Tensor>{copy_as(grad, in_dtype, in_device)};
  });
  return out;
}

}  // namespace

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return recorded_copy("ContiguousBackward", *this, dtype(), device());
}

Tensor Tensor::clone() const { return recorded_copy("CloneBackward", *this, dtype(), device()); }

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  if (requires_grad()) {
    LOCKSTEP_CHECK(is_floating(target)) << "to(" << dtype_name(target)
                                        << ") on a tensor that requires grad: integer tensors carry no gradient; "
                                           "detach() it first";
  }
  return recorded_copy("ToDTypeBackward", *this, target, device());
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  return recorded_copy("ToDeviceBackward", *this, dtype(), target);
}

}  // namespace lockstep
