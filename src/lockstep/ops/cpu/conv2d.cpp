#include "lockstep/ops/cpu/conv2d.h"

#include <algorithm>
#include <vector>

#include "lockstep/core/parallel.h"
#include "lockstep/core/tensor.h"
#include "lockstep/ops/cpu/gemm.h"
#include "lockstep/ops/cpu/im2col.h"
#include "lockstep/ops/cpu/reduce.h"

namespace lockstep::cpu {
namespace {

// The cut of the batch: `samples` per chunk (the last may hold fewer); backward sums the
// weight gradient of consecutive chunks into `slots` partial sums, added in slot order.
struct Plan {
  int64_t samples = 1, chunks = 0, slots = 1;
};

Plan make_plan(const Conv2dShape& s) {
  // Column matrix plus GEMM output of one chunk: 2^17 elements (512 KiB of f32) fit in L2
  // next to the weights; larger chunks measured slower, smaller ones barely faster.
  constexpr int64_t kChunkElements = int64_t{1} << 17;
  // Partial weight gradients held at once, at most: 8 slots or 16M elements in all.
  constexpr int64_t kMaxSlots = 8, kMaxPartialElements = int64_t{1} << 24;
  const BatchChunks cut = cut_batch(s, kChunkElements);
  Plan plan{cut.samples, cut.chunks};
  if (plan.chunks == 0) return plan;
  const int64_t weight_elements = std::max<int64_t>(1, s.out_channels * s.rows());
  plan.slots = std::clamp<int64_t>(kMaxPartialElements / weight_elements, 1, std::min(kMaxSlots, plan.chunks));
  return plan;
}

// Runs body(begin, end) over [0, n) work items: across the thread team (each GEMM then on
// its own thread) when there is more than one item, else inline so the GEMM itself is split
// across the team (ops/cpu/gemm.cpp).
template <typename Body>
void run_items(int64_t n, const Body& body) {
  if (n > 1 && num_threads() > 1) {
    parallel_for(n, 1, body);
  } else {
    body(int64_t{0}, n);
  }
}

// Per-thread scratch: the chunk's column matrix [K, samples·P] and an [O, samples·P] matrix.
template <typename T>
struct Scratch {
  Tensor col_holder, mat_holder;
  T* col;
  T* mat;
  Scratch(const Conv2dShape& s, const Plan& plan, Device device)
      : col_holder(Tensor::empty({s.rows() * plan.samples * s.win.out_plane()}, dtype_of<T>(), device)),
        mat_holder(Tensor::empty({s.out_channels * plan.samples * s.win.out_plane()}, dtype_of<T>(), device)),
        col(col_holder.data<T>()),
        mat(mat_holder.data<T>()) {}
};

template <typename T>
void forward_chunk(const T* x, const T* w, const T* bias, T* y, const Conv2dShape& s, int64_t first, int64_t count,
                   Scratch<T>& scratch) {
  const int64_t K = s.rows(), O = s.out_channels, P = s.win.out_plane(), ld = count * P;
  im2col(x + first * s.in_channels * s.win.in_plane(), count, s.in_channels, s.win, scratch.col, ld);
  gemm<T>(false, false, O, ld, K, T(1), w, K, scratch.col, ld, T(0), scratch.mat, ld);
  // [O, count·P] -> NCHW, adding the bias on the way.
  T* dst = y + first * O * P;
  for (int64_t g = 0; g < count; ++g) {
    for (int64_t o = 0; o < O; ++o) {
      const T* src = scratch.mat + o * ld + g * P;
      T* d = dst + (g * O + o) * P;
      const T b = bias != nullptr ? bias[o] : T(0);
      for (int64_t p = 0; p < P; ++p) d[p] = src[p] + b;
    }
  }
}

// Adds this chunk's weight and bias gradients into dw_partial / db_partial and writes its
// samples' input gradient.
template <typename T>
void backward_chunk(const T* x, const T* w, const T* dy, T* dx, T* dw_partial, double* db_partial, const Conv2dShape& s,
                    int64_t first, int64_t count, Scratch<T>& scratch) {
  const int64_t K = s.rows(), O = s.out_channels, P = s.win.out_plane(), ld = count * P;
  const int64_t image = s.in_channels * s.win.in_plane();
  // NCHW -> [O, count·P], the layout the GEMMs want.
  T* dyc = scratch.mat;
  for (int64_t g = 0; g < count; ++g)
    for (int64_t o = 0; o < O; ++o) {
      const T* src = dy + ((first + g) * O + o) * P;
      std::copy(src, src + P, dyc + o * ld + g * P);
    }
  if (db_partial != nullptr) {
    for (int64_t o = 0; o < O; ++o)
      db_partial[o] += sum_lanes_f64(dyc + o * ld, ld);  // one running sum would be latency-bound
  }
  if (dw_partial != nullptr) {
    im2col(x + first * image, count, s.in_channels, s.win, scratch.col, ld);
    gemm<T>(false, true, O, K, ld, T(1), dyc, ld, scratch.col, ld, T(1), dw_partial, K);
  }
  if (dx != nullptr) {
    gemm<T>(true, false, K, ld, O, T(1), w, K, dyc, ld, T(0), scratch.col, ld);
    col2im(scratch.col, ld, count, s.in_channels, s.win, dx + first * image);
  }
}

}  // namespace

BatchChunks cut_batch(const Conv2dShape& s, int64_t max_elements) {
  BatchChunks cut;
  if (s.batch == 0) return cut;
  const int64_t per_sample = (s.rows() + s.out_channels) * s.win.out_plane();
  const int64_t most = std::max<int64_t>(1, max_elements / std::max<int64_t>(per_sample, 1));
  const int64_t chunks = (s.batch + most - 1) / most;
  cut.samples = (s.batch + chunks - 1) / chunks;  // even chunks rather than a small last one
  cut.chunks = (s.batch + cut.samples - 1) / cut.samples;
  return cut;
}

template <typename T>
void conv2d_forward(const T* x, const T* w, const T* bias, T* y, const Conv2dShape& s, Device device) {
  const Plan plan = make_plan(s);
  run_items(plan.chunks, [&](int64_t begin, int64_t end) {
    Scratch<T> scratch(s, plan, device);
    for (int64_t c = begin; c < end; ++c) {
      const int64_t first = c * plan.samples;
      forward_chunk(x, w, bias, y, s, first, std::min(plan.samples, s.batch - first), scratch);
    }
  });
}

template <typename T>
void conv2d_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, const Conv2dShape& s, Device device) {
  const Plan plan = make_plan(s);
  const int64_t weights = s.out_channels * s.rows();
  // One partial sum per slot; a single slot accumulates straight into dw.
  const Tensor dw_partials =
      dw != nullptr && plan.slots > 1 ? Tensor::zeros({plan.slots * weights}, dtype_of<T>(), device) : Tensor();
  if (dw != nullptr && plan.slots == 1) std::fill(dw, dw + weights, T(0));
  std::vector<double> db_partials(db != nullptr ? static_cast<size_t>(plan.slots * s.out_channels) : 0, 0.0);
  run_items(plan.slots, [&](int64_t begin, int64_t end) {
    Scratch<T> scratch(s, plan, device);
    for (int64_t slot = begin; slot < end; ++slot) {
      T* dw_slot = dw == nullptr ? nullptr : plan.slots == 1 ? dw : dw_partials.data<T>() + slot * weights;
      double* db_slot = db == nullptr ? nullptr : db_partials.data() + slot * s.out_channels;
      for (int64_t c = slot * plan.chunks / plan.slots; c < (slot + 1) * plan.chunks / plan.slots; ++c) {
        const int64_t first = c * plan.samples;
        backward_chunk(x, w, dy, dx, dw_slot, db_slot, s, first, std::min(plan.samples, s.batch - first), scratch);
      }
    }
  });
  if (dw != nullptr && plan.slots > 1) {
    const T* partial = dw_partials.data<T>();
    parallel_for(weights, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        T total = partial[i];
        for (int64_t slot = 1; slot < plan.slots; ++slot) total += partial[slot * weights + i];
        dw[i] = total;
      }
    });
  }
  if (db != nullptr) {
    for (int64_t o = 0; o < s.out_channels; ++o) {
      double total = 0;
      for (int64_t slot = 0; slot < plan.slots; ++slot)
        total += db_partials[static_cast<size_t>(slot * s.out_channels + o)];
      db[o] = static_cast<T>(total);
    }
  }
}

template void conv2d_forward<float>(const float*, const float*, const float*, float*, const Conv2dShape&, Device);
template void conv2d_forward<double>(const double*, const double*, const double*, double*, const Conv2dShape&, Device);
template void conv2d_backward<float>(const float*, const float*, const float*, float*, float*, float*,
                                     const Conv2dShape&, Device);
template void conv2d_backward<double>(const double*, const double*, const double*, double*, double*, double*,
                                      const Conv2dShape&, Device);

}  // namespace lockstep::cpu
