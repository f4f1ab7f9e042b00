// CPU reduction kernels over contiguous data. Every result is computed in an order fixed by
// the shape alone (fixed lanes and fixed chunks, combined in index order), never by the
// thread count, so sums are bit-identical whether one thread or sixteen ran them.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/core/shape.h"

namespace lockstep::cpu {

// Elements per parallel task; also the fixed chunk length of long sums.
inline constexpr int64_t kGrain = 32768;

// Sum of n contiguous values: 32 interleaved partial sums (so the loop vectorizes) folded
// pairwise; past kGrain elements, fixed chunks of kGrain summed in parallel then combined.
template <typename T>
T sum_contiguous(const T* x, int64_t n);

// Sum of n contiguous values accumulated in f64, in the lane order of sum_contiguous's
// chunks, on the calling thread: f64 precision at the speed of a vectorized loop.
template <typename T>
double sum_lanes_f64(const T* x, int64_t n);

// Largest of n contiguous values (nan if any is nan); -inf for n == 0.
template <typename T>
T max_contiguous(const T* x, int64_t n);

// x viewed as [outer, n, inner] summed over the middle axis into out [outer, inner]. Each
// output adds its n terms in index order, except that a very long middle axis with few
// outputs is cut into fixed row blocks whose sums are then added in order.
template <typename T>
void sum_middle(const T* x, int64_t outer, int64_t n, int64_t inner, T* out);

// x (contiguous, `shape`) summed over the axes where reduce[axis] is true; out receives the
// kept axes in order, contiguous. Adjacent axes are merged first, so the common cases (all
// axes, trailing axes, leading axes) are one pass of sum_middle.
template <typename T>
void sum_axes(const T* x, const Shape& shape, const std::vector<bool>& reduce, T* out);

// One pass of sum_axes: its input viewed as [outer, n, inner], summed over the middle axis
// into [outer, inner].
struct SumPass {
  int64_t outer, n, inner;
};

// sum_axes's passes, from the shape alone (ops/reduce.cpp runs the same passes on a GPU):
// neighbouring axes of the same kind merged (size-1 axes are neither), then one pass per
// reduced group, last group first, each pass reading the previous pass's output. None when
// no axis longer than 1 is reduced: out is then a copy of x.
std::vector<SumPass> plan_sum_axes(const Shape& shape, const std::vector<bool>& reduce);

// Max along the middle axis of [outer, n, inner] (n >= 1): the value (when values is not
// null) and the index of its first occurrence; a nan counts as the largest value.
template <typename T>
void max_middle(const T* x, int64_t outer, int64_t n, int64_t inner, T* values, int64_t* indices);

// Runs body(o, c0, c1) over every outer index o and column range [c0, c1) of inner, in
// parallel tasks of about kGrain elements, given that each (o, column) costs `work` elements.
template <typename Body>
void for_each_tile(int64_t outer, int64_t inner, int64_t work, const Body& body);

}  // namespace lockstep::cpu

#include <algorithm>

#include "lockstep/core/parallel.h"

namespace lockstep::cpu {

template <typename Body>
void for_each_tile(int64_t outer, int64_t inner, int64_t work, const Body& body) {
  if (outer <= 0 || inner <= 0) return;
  work = std::max<int64_t>(work, 1);
  // Tiles of whole rows when rows are short; rows cut into column tiles when they are long.
  const int64_t tile = std::min(inner, std::max<int64_t>(kGrain / work, 16));
  const int64_t tiles_per_row = (inner + tile - 1) / tile;
  const int64_t tasks = outer * tiles_per_row;
  const int64_t grain = std::max<int64_t>(1, kGrain / (tile * work));
  parallel_for(tasks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t o = task / tiles_per_row;
      const int64_t c0 = (task % tiles_per_row) * tile;
      body(o, c0, std::min(inner, c0 + tile));
    }
  });
}

}  // namespace lockstep::cpu
