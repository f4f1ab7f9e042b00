#include "lockstep/core/tensor.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/tensor_copy.h"
#endif

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iomanip>

namespace lockstep {

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) {
    LOCKSTEP_CHECK(d >= 0) << "negative dimension " << d << " in shape " << shape_str(shape);
  }
  return from_storage(
      std::make_shared<Storage>(device, static_cast<size_t>(lockstep::numel(shape)) * dtype_size(dtype)), shape, dtype);
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype) {
  const size_t needed = static_cast<size_t>(lockstep::numel(shape)) * dtype_size(dtype);
  LOCKSTEP_CHECK(storage->nbytes() >= needed)
      << "a " << shape_str(shape) << " " << dtype_name(dtype) << " tensor needs " << needed
      << " bytes; the storage has " << storage->nbytes();
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero();
  return t;
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill(value);
  return t;
}

Tensor Tensor::scalar(double value, DType dtype, Device device) { return full({}, value, dtype, device); }

int64_t Tensor::size(int64_t axis) const { return shape()[static_cast<size_t>(wrap_axis(axis, dim()))]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape().size(); i-- > 0;) {
    if (shape()[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

void Storage::fail_released() {
  LOCKSTEP_FAIL() << "this tensor's bytes are released: it is a parameter sharded by ZeRO-3, used outside the "
                     "forward and backward of the module that owns it. Call modules as module(x), not "
                     "module.forward(x), so its parameters are gathered first; a parameter used outside its "
                     "module (a tied head) belongs in no unit: name the unit modules' types (zero3_unit_types)";
  std::abort();
}

void Storage::fail_not_own() {
  LOCKSTEP_FAIL() << "only storage from the device allocator can release its bytes, not external memory";
  std::abort();
}

void* Tensor::raw_data() const {
  LOCKSTEP_CHECK(device().is_cpu()) << "host access to a tensor on " << device()
                                    << ": copy it to the CPU first with .to(Device::cpu())";
  return data_ptr();
}

void* Tensor::data_ptr() const {
  return static_cast<char*>(storage()->data()) + offset() * static_cast<int64_t>(dtype_size(dtype()));
}

void Tensor::check_dtype(DType expected) const {
  LOCKSTEP_CHECK(dtype() == expected) << "tensor of dtype " << dtype_name(dtype()) << " accessed as "
                                      << dtype_name(expected);
}

double Tensor::item() const {
  LOCKSTEP_CHECK(numel() == 1) << "item() needs a tensor with one element, got shape " << shape_str(shape());
  return to_vector<double>()[0];
}

void Tensor::set_data(const Tensor& view) const {
  LOCKSTEP_CHECK(view.shape() == shape() && view.dtype() == dtype())
      << "set_data: a " << shape_str(view.shape()) << " " << dtype_name(view.dtype())
      << " tensor cannot hold the elements of a " << shape_str(shape()) << " " << dtype_name(dtype()) << " tensor";
  TensorImpl* self = impl();
  self->storage = view.storage();
  self->offset = view.offset();
  self->strides = view.strides();
}

Tensor Tensor::as_strided(const Shape& new_shape, const Strides& new_strides, int64_t new_offset) const {
  LOCKSTEP_CHECK(new_shape.size() == new_strides.size())
      << "as_strided: shape " << shape_str(new_shape) << " and strides " << shape_str(new_strides) << " differ in rank";
  int64_t lo = new_offset, hi = new_offset;
  for (size_t i = 0; i < new_shape.size(); ++i) {
    if (new_shape[i] == 0) {
      lo = hi = new_offset;
      break;
    }
    const int64_t span = (new_shape[i] - 1) * new_strides[i];
    (span < 0 ? lo : hi) += span;
  }
  const int64_t capacity = static_cast<int64_t>(storage()->nbytes() / dtype_size(dtype()));
  LOCKSTEP_CHECK(lo >= 0 && (lockstep::numel(new_shape) == 0 || hi < capacity))
      << "as_strided: view " << shape_str(new_shape) << " at offset " << new_offset << " reaches outside a storage of "
      << capacity << " elements";
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage();
  impl->offset = new_offset;
  impl->shape = new_shape;
  impl->strides = new_strides;
  impl->dtype = dtype();
  return Tensor(std::move(impl));
}

namespace {

// Copies one row of `count` elements of the same size between strided places.
template <typename Word>
void copy_row(const char* src, int64_t src_step, char* dst, int64_t dst_step, int64_t count) {
  const auto* s = reinterpret_cast<const Word*>(src);
  auto* d = reinterpret_cast<Word*>(dst);
  if (src_step == 1 && dst_step == 1) {
    std::memcpy(d, s, static_cast<size_t>(count) * sizeof(Word));
  } else if (src_step == 0) {
    std::fill_n(d, count, *s);  // only reached with dst_step == 1 (see below)
  } else {
    for (int64_t j = 0; j < count; ++j) d[j * dst_step] = s[j * src_step];
  }
}

}  // namespace

void strided_copy(const Tensor& src, const Tensor& dst) {
  LOCKSTEP_CHECK(src.shape() == dst.shape())
      << "copy: source shape " << shape_str(src.shape()) << " differs from destination " << shape_str(dst.shape());
  const int64_t n = src.numel();
  if (n == 0) return;
#if LOCKSTEP_HAVE_CUDA
  if (src.device().is_cuda() || dst.device().is_cuda()) return cuda::copy_tensor(src, dst);
#endif
  if (src.is_contiguous() && dst.is_contiguous()) {
    convert_elements(src.raw_data(), src.dtype(), dst.raw_data(), dst.dtype(), n);
    return;
  }
  // Walk the index space with the last axis as the inner loop, one row at a time: rows of
  // the same dtype are copied directly, others converted through a contiguous buffer.
  const int64_t rank = src.dim();
  const int64_t inner = rank ? src.shape().back() : 1;
  const int64_t src_step = rank ? src.strides().back() : 1;
  const int64_t dst_step = rank ? dst.strides().back() : 1;
  const size_t src_size = dtype_size(src.dtype()), dst_size = dtype_size(dst.dtype());
  const bool same_dtype = src.dtype() == dst.dtype();
  const char* src_base = static_cast<const char*>(src.raw_data());
  char* dst_base = static_cast<char*>(dst.raw_data());
  std::vector<int64_t> index(static_cast<size_t>(std::max<int64_t>(rank - 1, 0)), 0);
  std::vector<char> src_row, dst_row;
  if (!same_dtype) {
    src_row.resize(static_cast<size_t>(inner) * src_size);
    dst_row.resize(static_cast<size_t>(inner) * dst_size);
  }
  for (int64_t done = 0; done < n; done += inner) {
    int64_t src_off = 0, dst_off = 0;
    for (size_t i = 0; i < index.size(); ++i) {
      src_off += index[i] * src.strides()[i];
      dst_off += index[i] * dst.strides()[i];
    }
    const char* s = src_base + src_off * static_cast<int64_t>(src_size);
    char* d = dst_base + dst_off * static_cast<int64_t>(dst_size);
    if (same_dtype && (src_step != 0 || dst_step == 1)) {
      switch (src_size) {
        case 1:
          copy_row<uint8_t>(s, src_step, d, dst_step, inner);
          break;
        case 2:
          copy_row<uint16_t>(s, src_step, d, dst_step, inner);
          break;
        case 4:
          copy_row<uint32_t>(s, src_step, d, dst_step, inner);
          break;
        default:
          copy_row<uint64_t>(s, src_step, d, dst_step, inner);
          break;
      }
    } else {
      for (int64_t j = 0; j < inner; ++j)
        std::memcpy(&src_row[static_cast<size_t>(j) * src_size], s + j * src_step * static_cast<int64_t>(src_size),
                    src_size);
      convert_elements(src_row.data(), src.dtype(), dst_row.data(), dst.dtype(), inner);
      for (int64_t j = 0; j < inner; ++j)
        std::memcpy(d + j * dst_step * static_cast<int64_t>(dst_size), &dst_row[static_cast<size_t>(j) * dst_size],
                    dst_size);
    }
    for (size_t i = index.size(); i-- > 0;) {
      if (++index[i] < src.shape()[i]) break;
      index[i] = 0;
    }
  }
}

void Tensor::copy_from(const Tensor& src) const { strided_copy(src, *this); }

void Tensor::fill(double value) const {
#if LOCKSTEP_HAVE_CUDA
  if (device().is_cuda()) return cuda::fill_tensor(*this, value);
#endif
  if (is_contiguous()) {
    if (numel() == 0) return;
    if (value == 0.0 && !std::signbit(value)) {  // -0.0 is not all-zero bits
      std::memset(raw_data(), 0, nbytes());
      return;
    }
    if (dtype() == DType::f32) {
      std::fill_n(data<float>(), numel(), static_cast<float>(value));
      return;
    }
  }
  const Tensor one = Tensor::empty({}, DType::f64, device());
  *one.data<double>() = value;
  // Broadcast the scalar with zero strides.
  strided_copy(one.as_strided(shape(), Strides(shape().size(), 0), 0), *this);
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) {
  if (!tensor.defined()) return out << "Tensor(undefined)";
  out << "Tensor" << shape_str(tensor.shape()) << " " << dtype_name(tensor.dtype()) << " " << tensor.device();
  if (tensor.numel() <= 16 && tensor.device().is_cpu()) {
    out << " {";
    const auto values = tensor.to_vector<double>();
    for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << std::setprecision(6) << values[i];
    out << "}";
  }
  return out;
}

}  // namespace lockstep
