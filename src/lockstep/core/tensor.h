// Tensor: a cheap handle (shared_ptr) to a strided view of a Storage on one device, plus
// the autograd record of how it was made. Copying a Tensor copies the handle; views
// (slice, transpose, reshape of contiguous data) share bytes. Ops are free functions in
// lockstep/ops; this class holds only what every layer needs.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <ostream>
#include <vector>

#include "lockstep/core/device.h"
#include "lockstep/core/dtype.h"
#include "lockstep/core/error.h"
#include "lockstep/core/shape.h"
#include "lockstep/core/storage.h"

namespace lockstep {

namespace autograd {
class Node;
}

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Strides strides;
  DType dtype = DType::f32;

  // Autograd: a tensor either is a leaf (grad_fn empty) or was produced by grad_fn's
  // output number output_nr. Leaves that require grad accumulate into `grad`.
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;
  uint32_t output_nr = 0;
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves only; made on first use
  // Leaves only: runs once a backward pass has added all of its contributions into grad.
  std::shared_ptr<const std::function<void()>> post_accumulate_grad_hook;
  // Leaves only: where the next backward pass should put this leaf's gradient (see
  // Tensor::set_grad_destination); cleared when that pass reaches the leaf. Handed to one
  // op at most (a second op using the leaf in the same pass gets a tensor of its own).
  std::shared_ptr<TensorImpl> grad_destination;
  bool grad_destination_given = false;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- factories (no autograd history) ---
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor scalar(double value, DType dtype = DType::f32, Device device = Device::cpu());
  // A contiguous tensor over existing bytes (see Storage's external-memory constructor).
  static Tensor from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype);
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device = Device::cpu());

  // --- metadata ---
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl()->shape; }
  int64_t dim() const { return static_cast<int64_t>(impl()->shape.size()); }
  int64_t size(int64_t axis) const;  // negative axes count from the end
  int64_t numel() const { return lockstep::numel(impl()->shape); }
  const Strides& strides() const { return impl()->strides; }
  int64_t offset() const { return impl()->offset; }
  DType dtype() const { return impl()->dtype; }
  Device device() const { return impl()->storage->device(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl()->storage; }

  // --- element access (CPU; the dtype must match T) ---
  template <typename T>
  T* data() const;
  void* raw_data() const;
  // The address of the first element on any device (a GPU pointer for cuda tensors): for
  // kernels, never dereferenced on the host.
  void* data_ptr() const;
  template <typename T>
  T* data_ptr() const {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(data_ptr());
  }
  // Converts every element to T (copying from any layout); for tests and I/O.
  template <typename T>
  std::vector<T> to_vector() const;
  double item() const;  // the single element of a one-element tensor, as double

  // --- copies and views without autograd ---
  // A view of the same storage with the given shape, strides and offset; checked to stay
  // inside the storage.
  Tensor as_strided(const Shape& shape, const Strides& strides, int64_t offset) const;
  // Makes this tensor's elements those of `view` (same shape and dtype, any device), keeping
  // the tensor itself: its .grad, hooks and every handle to it stay (PyTorch's
  // `p.data = view`). Data parallelism moves a replica onto its device, and ZeRO gathers a
  // model's parameters into one flat buffer, this way.
  void set_data(const Tensor& view) const;
  // Writes src (same shape, any layout or dtype) into this tensor's elements.
  void copy_from(const Tensor& src) const;
  void fill(double value) const;
  void zero() const { fill(0.0); }

  // --- copies and views with autograd (defined in lockstep/ops) ---
  Tensor contiguous() const;  // this tensor when already contiguous, else a copy
  Tensor clone() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor reshape(const Shape& shape) const;

  // --- autograd (defined in lockstep/autograd) ---
  bool requires_grad() const { return impl()->requires_grad; }
  // Marks a leaf as a parameter-like tensor whose gradient accumulates in grad().
  Tensor& set_requires_grad(bool requires_grad);
  bool is_leaf() const { return impl()->grad_fn == nullptr; }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl()->grad_fn; }
  Tensor grad() const { return Tensor(impl()->grad); }
  void set_grad(const Tensor& grad) const { impl()->grad = grad.impl_; }
  // Calls hook() each time a backward pass has finished accumulating into this leaf's grad
  // (PyTorch's register_post_accumulate_grad_hook): data parallelism starts reducing a
  // bucket of gradients while backward computes the rest. One hook per leaf; an empty
  // function removes it.
  void set_post_accumulate_grad_hook(std::function<void()> hook) const;
  // Asks the next backward pass to compute this leaf's gradient straight into `view` (a
  // contiguous tensor of its shape, dtype and device, typically a slice of a gradient
  // bucket), where the op producing it can: grad() then is `view` itself, with no copy.
  // Ops that cannot (or a leaf that already has a grad) give an ordinary gradient. Only
  // the next pass uses it; an undefined view removes it.
  void set_grad_destination(const Tensor& view) const;
  // Same bytes, no history, requires_grad false.
  Tensor detach() const;
  // Computes gradients of this tensor with respect to every leaf that requires grad.
  // With no argument the tensor must hold one element (a loss) and the seed gradient is 1.
  void backward(const Tensor& gradient = Tensor()) const;

  TensorImpl* impl() const {
    LOCKSTEP_CHECK(impl_ != nullptr) << "use of an undefined Tensor (default-constructed or moved-from)";
    return impl_.get();
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  void check_dtype(DType expected) const;
  std::shared_ptr<TensorImpl> impl_;
};

// "Tensor[2, 3] f32 cpu:0" and, for small tensors, the values.
std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

// Copies src into dst (same shape) across any strides and dtypes. Kernels ask for
// contiguous inputs; this is how strided views become contiguous.
void strided_copy(const Tensor& src, const Tensor& dst);

template <typename T>
T* Tensor::data() const {
  check_dtype(dtype_of<T>());
  return static_cast<T*>(raw_data());
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  LOCKSTEP_CHECK(static_cast<int64_t>(values.size()) == lockstep::numel(shape))
      << "from_vector: " << values.size() << " values do not fill shape " << shape_str(shape);
  Tensor t = empty(shape, dtype_of<T>(), device.is_cpu() ? device : Device::cpu());
  std::copy(values.begin(), values.end(), t.data<T>());
  return device.is_cpu() ? t : t.to(device);
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  const Tensor dense = Tensor::empty(shape(), dtype_of<T>(), device().is_cpu() ? device() : Device::cpu());
  dense.copy_from(*this);
  const T* p = dense.data<T>();
  return std::vector<T>(p, p + dense.numel());
}

}  // namespace lockstep
