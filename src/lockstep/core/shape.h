// Shapes and strides (in elements). A tensor is a strided view of a storage, so slicing a
// batch or transposing a matrix changes only these numbers, never the bytes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

namespace lockstep {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

int64_t numel(const Shape& shape);
Strides contiguous_strides(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3]"

// Wraps a possibly negative axis into [0, rank); throws Error naming the axis and rank.
int64_t wrap_axis(int64_t axis, int64_t rank);

// NumPy broadcasting of two shapes; throws Error naming both shapes when they do not match.
Shape broadcast_shapes(const Shape& a, const Shape& b);

}  // namespace lockstep
