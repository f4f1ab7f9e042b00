// Fills draw one double per element (two 32-bit words) whatever the dtype, so an f32 and an
// f64 tensor filled from the same generator state hold the same values up to rounding.
#include "lockstep/ops/random.h"

#include <cmath>

#include "lockstep/ops/dispatch.h"

namespace lockstep {
namespace {

// Writes value_of(i) to every element in row-major order, through a contiguous buffer
// when t is a strided view.
template <typename Fill>
void fill_in_order(const char* op, const Tensor& t, const Fill& value_of) {
  ops::require_cpu(op, t.device());
  ops::require_float(op, t);
  LOCKSTEP_CHECK(t.is_leaf() || !t.requires_grad())
      << op << ": in-place fill of a tensor computed by an op would corrupt its autograd history; fill a leaf "
      << "(a parameter) or a detached tensor";
  const Tensor dense = t.is_contiguous() ? t : Tensor::empty(t.shape(), t.dtype(), t.device());
  ops::dispatch_float(op, t.dtype(), [&]<typename T>() {
    T* p = dense.data<T>();
    for (int64_t i = 0; i < dense.numel(); ++i) p[i] = value_of.template operator()<T>();
  });
  if (!dense.is_same(t)) t.copy_from(dense);
}

}  // namespace

void uniform_(const Tensor& t, double low, double high, Philox& rng) {
  LOCKSTEP_CHECK(std::isfinite(low) && std::isfinite(high) && low < high)
      << "uniform_: needs finite low < high, got [" << low << ", " << high << ")";
  fill_in_order("uniform_", t, [&]<typename T>() {
    const T value = static_cast<T>(low + (high - low) * rng.next_double());
    // Rounding to T may reach `high`; keep the interval half-open.
    return value < static_cast<T>(high) ? value : std::nextafter(static_cast<T>(high), static_cast<T>(low));
  });
}

void normal_(const Tensor& t, double mean, double stddev, Philox& rng) {
  LOCKSTEP_CHECK(std::isfinite(mean) && std::isfinite(stddev) && stddev >= 0)
      << "normal_: needs a finite mean and a finite stddev >= 0, got mean " << mean << ", stddev " << stddev;
  fill_in_order("normal_", t, [&]<typename T>() { return static_cast<T>(mean + stddev * rng.next_normal()); });
}

}  // namespace lockstep
