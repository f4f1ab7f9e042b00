#include "lockstep/core/shape.h"

#include <sstream>

#include "lockstep/core/error.h"

namespace lockstep {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    // A 0 elsewhere makes the tensor empty, but not these strides small.
    LOCKSTEP_CHECK(!__builtin_mul_overflow(stride, shape[i] > 0 ? shape[i] : 1, &stride))
        << "shape " << shape_str(shape) << " is too large: its strides overflow 64 bits";
  }
  return strides;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

int64_t wrap_axis(int64_t axis, int64_t rank) {
  const int64_t wrapped = axis < 0 ? axis + rank : axis;
  LOCKSTEP_CHECK(wrapped >= 0 && wrapped < rank) << "axis " << axis << " is out of range for a tensor of rank " << rank
                                                 << " (valid: " << -rank << " to " << rank - 1 << ")";
  return wrapped;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    LOCKSTEP_CHECK(da == db || da == 1 || db == 1)
        << "shapes " << shape_str(a) << " and " << shape_str(b) << " cannot be broadcast together";
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace lockstep
