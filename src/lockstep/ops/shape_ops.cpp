// Views (reshape of contiguous data, transpose, permute, slice, squeeze) are new strides over
// the same storage; concat copies. Each records a backward that maps the gradient back to
// the input's shape; those gradients are handed back contiguous, since kernels want that.
#include "lockstep/ops/shape_ops.h"

#include <algorithm>
#include <numeric>

#include "lockstep/autograd/node.h"
#include "lockstep/ops/dispatch.h"

namespace lockstep {
namespace {

// Resolves one -1 in `requested` against x's element count.
Shape infer_shape(const Shape& from, const Shape& requested) {
  const int64_t total = numel(from);
  int64_t known = 1;
  int64_t inferred = -1;
  for (size_t i = 0; i < requested.size(); ++i) {
    const int64_t d = requested[i];
    if (d == -1) {
      LOCKSTEP_CHECK(inferred < 0) << "reshape: only one axis may be -1, got " << shape_str(requested);
      inferred = static_cast<int64_t>(i);
    } else {
      LOCKSTEP_CHECK(d >= 0) << "reshape: invalid size " << d << " in " << shape_str(requested);
      known *= d;
    }
  }
  Shape shape = requested;
  if (inferred >= 0) {
    LOCKSTEP_CHECK(known > 0 && total % known == 0)
        << "reshape: cannot reshape " << shape_str(from) << " (" << total << " elements) into " << shape_str(requested)
        << ": " << total << " is not a multiple of " << known;
    shape[static_cast<size_t>(inferred)] = total / known;
    known = total;
  }
  LOCKSTEP_CHECK(known == total) << "reshape: cannot reshape " << shape_str(from) << " (" << total << " elements) into "
                                 << shape_str(requested) << " (" << known << " elements)";
  return shape;
}

// A contiguous copy (no autograd) when t is not contiguous already.
Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
  out.copy_from(t);
  return out;
}

// The gradient of a view is the output gradient reshaped back (a copy when it is strided).
autograd::BackwardFn reshape_back(const Shape& in_shape) {
  return [in_shape](const std::vector<Tensor>& g) {
    const Tensor grad = dense(g[0]);
    return std::vector<Tensor>{grad.as_strided(in_shape, contiguous_strides(in_shape), grad.offset())};
  };
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  const Shape target = infer_shape(x.shape(), shape);
  const Tensor src = x.contiguous();  // records its own backward when it copies
  Tensor out = src.as_strided(target, contiguous_strides(target), src.offset());
  autograd::record("ReshapeBackward", {src}, {out}, reshape_back(src.shape()));
  return out;
}

Tensor Tensor::reshape(const Shape& shape) const { return lockstep::reshape(*this, shape); }

Tensor flatten(const Tensor& x, int64_t start_axis, int64_t end_axis) {
  if (x.dim() == 0) return reshape(x, {1});
  const int64_t start = wrap_axis(start_axis, x.dim()), end = wrap_axis(end_axis, x.dim());
  LOCKSTEP_CHECK(start <= end) << "flatten: start axis " << start_axis << " comes after end axis " << end_axis
                               << " for shape " << shape_str(x.shape());
  Shape shape(x.shape().begin(), x.shape().begin() + start);
  shape.push_back(
      std::accumulate(x.shape().begin() + start, x.shape().begin() + end + 1, int64_t{1}, std::multiplies<int64_t>()));
  shape.insert(shape.end(), x.shape().begin() + end + 1, x.shape().end());
  return reshape(x, shape);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& axes) {
  const int64_t rank = x.dim();
  LOCKSTEP_CHECK(static_cast<int64_t>(axes.size()) == rank)
      << "permute: " << axes.size() << " axes given for a tensor of rank " << rank << " (shape " << shape_str(x.shape())
      << ")";
  std::vector<int64_t> inverse(axes.size(), -1);
  Shape shape(axes.size());
  Strides strides(axes.size());
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t a = wrap_axis(axes[i], rank);
    LOCKSTEP_CHECK(inverse[static_cast<size_t>(a)] < 0)
        << "permute: axis " << a << " appears twice in " << shape_str(axes);
    inverse[static_cast<size_t>(a)] = static_cast<int64_t>(i);
    shape[i] = x.shape()[static_cast<size_t>(a)];
    strides[i] = x.strides()[static_cast<size_t>(a)];
  }
  Tensor out = x.as_strided(shape, strides, x.offset());
  autograd::record("PermuteBackward", {x}, {out}, [inverse](const std::vector<Tensor>& g) {
    Shape shape(inverse.size());
    Strides strides(inverse.size());
    for (size_t i = 0; i < inverse.size(); ++i) {
      shape[i] = g[0].shape()[static_cast<size_t>(inverse[i])];
      strides[i] = g[0].strides()[static_cast<size_t>(inverse[i])];
    }
    return std::vector<Tensor>{dense(g[0].as_strided(shape, strides, g[0].offset()))};
  });
  return out;
}

Tensor transpose(const Tensor& x, int64_t axis0, int64_t axis1) {
  std::vector<int64_t> axes(static_cast<size_t>(x.dim()));
  std::iota(axes.begin(), axes.end(), int64_t{0});
  std::swap(axes[static_cast<size_t>(wrap_axis(axis0, x.dim()))], axes[static_cast<size_t>(wrap_axis(axis1, x.dim()))]);
  return permute(x, axes);
}

Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step) {
  LOCKSTEP_CHECK(step > 0) << "slice: step must be positive, got " << step;
  const int64_t a = wrap_axis(axis, x.dim());
  const int64_t n = x.shape()[static_cast<size_t>(a)];
  auto clamp = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  const int64_t lo = clamp(start), hi = clamp(end);
  const int64_t length = hi > lo ? (hi - lo + step - 1) / step : 0;
  Shape shape = x.shape();
  Strides strides = x.strides();
  shape[static_cast<size_t>(a)] = length;
  strides[static_cast<size_t>(a)] *= step;
  const int64_t offset = x.offset() + (length > 0 ? lo * x.strides()[static_cast<size_t>(a)] : 0);
  Tensor out = x.as_strided(shape, strides, offset);
  autograd::record("SliceBackward", {x}, {out}, [in_shape = x.shape(), a, lo, step](const std::vector<Tensor>& g) {
    Tensor grad = Tensor::zeros(in_shape, g[0].dtype(), g[0].device());
    Strides strides = grad.strides();
    const int64_t offset = lo * strides[static_cast<size_t>(a)];
    strides[static_cast<size_t>(a)] *= step;
    if (g[0].numel() > 0) grad.as_strided(g[0].shape(), strides, offset).copy_from(g[0]);
    return std::vector<Tensor>{grad};
  });
  return out;
}

Tensor concat(const std::vector<Tensor>& tensors, int64_t axis) {
  LOCKSTEP_CHECK(!tensors.empty()) << "concat: no tensors given";
  for (size_t i = 0; i < tensors.size(); ++i)
    LOCKSTEP_CHECK(tensors[i].defined()) << "concat: tensor " << i << " is undefined";
  const Tensor& first = tensors[0];
  LOCKSTEP_CHECK(first.dim() > 0) << "concat: tensors must have at least one axis, tensor 0 is a scalar";
  const int64_t a = wrap_axis(axis, first.dim());
  Shape shape = first.shape();
  shape[static_cast<size_t>(a)] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    bool match = t.dim() == first.dim();
    for (int64_t d = 0; match && d < first.dim(); ++d) match = d == a || t.size(d) == first.size(d);
    LOCKSTEP_CHECK(match) << "concat: tensor " << i << " has shape " << shape_str(t.shape()) << " but tensor 0 has "
                          << shape_str(first.shape()) << "; shapes must match on every axis except axis " << a;
    LOCKSTEP_CHECK(t.dtype() == first.dtype()) << "concat: tensor " << i << " is " << dtype_name(t.dtype())
                                               << " but tensor 0 is " << dtype_name(first.dtype());
    LOCKSTEP_CHECK(t.device() == first.device())
        << "concat: tensor " << i << " is on " << t.device() << " but tensor 0 is on " << first.device();
    shape[static_cast<size_t>(a)] += t.size(a);
  }
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  std::vector<int64_t> starts;
  int64_t start = 0;
  for (const Tensor& t : tensors) {
    starts.push_back(start);
    if (t.numel() > 0)
      out.as_strided(t.shape(), out.strides(), start * out.strides()[static_cast<size_t>(a)]).copy_from(t);
    start += t.size(a);
  }
  autograd::record("ConcatBackward", tensors, {out}, [a, starts](const std::vector<Tensor>& g) {
    const Tensor grad = dense(g[0]);
    std::vector<Tensor> grads;
    for (size_t i = 0; i < starts.size(); ++i) {
      const int64_t end = i + 1 < starts.size() ? starts[i + 1] : grad.size(a);
      Shape shape = grad.shape();
      shape[static_cast<size_t>(a)] = end - starts[i];
      grads.push_back(dense(
          grad.as_strided(shape, grad.strides(), grad.offset() + starts[i] * grad.strides()[static_cast<size_t>(a)])));
    }
    return grads;
  });
  return out;
}

Tensor unsqueeze(const Tensor& x, int64_t axis) {
  const int64_t a = wrap_axis(axis, x.dim() + 1);
  Shape shape = x.shape();
  Strides strides = x.strides();
  const int64_t stride = a < x.dim() ? x.strides()[static_cast<size_t>(a)] * x.shape()[static_cast<size_t>(a)] : 1;
  shape.insert(shape.begin() + a, 1);
  strides.insert(strides.begin() + a, stride);
  Tensor out = x.as_strided(shape, strides, x.offset());
  autograd::record("UnsqueezeBackward", {x}, {out}, reshape_back(x.shape()));
  return out;
}

Tensor squeeze(const Tensor& x, int64_t axis) {
  const int64_t a = wrap_axis(axis, x.dim());
  LOCKSTEP_CHECK(x.size(a) == 1) << "squeeze: axis " << axis << " of shape " << shape_str(x.shape()) << " has size "
                                 << x.size(a) << ", not 1";
  Shape shape = x.shape();
  Strides strides = x.strides();
  shape.erase(shape.begin() + a);
  strides.erase(strides.begin() + a);
  Tensor out = x.as_strided(shape, strides, x.offset());
  autograd::record("SqueezeBackward", {x}, {out}, reshape_back(x.shape()));
  return out;
}

}  // namespace lockstep
