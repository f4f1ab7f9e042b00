// Fills draw one double per element (two 32-bit words) whatever the dtype, so an f32 and an
// f64 tensor filled from the same generator state hold the same values up to rounding. On a
// GPU every element reads its own words of the stream (Philox is counter-based), so the
// values are the CPU's, and the generator ends where the CPU's loop would leave it. This file
// compiles with -ffp-contract=off (CMakeLists.txt): low + span * u and mean + stddev * z round
// the product, then the sum, as the GPU's kernels do, whatever the compiler and its flags.
#include "lockstep/ops/random.h"

#include <cmath>

#include "lockstep/ops/dispatch.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/ops/cuda/random_kernels.h"
#endif

namespace lockstep {
namespace {

void check_fill(const char* op, const Tensor& t) {
  ops::require_device(op, t.device());
  ops::require_float(op, t);
  LOCKSTEP_CHECK(t.is_leaf() || !t.requires_grad())
      << op << ": in-place fill of a tensor computed by an op would corrupt its autograd history; fill a leaf "
      << "(a parameter) or a detached tensor";
}

// Runs write(dense) on t itself when it is contiguous, else on a contiguous buffer that is
// then copied into the strided view.
template <typename Write>
void write_dense(const Tensor& t, const Write& write) {
  const Tensor dense = t.is_contiguous() ? t : Tensor::empty(t.shape(), t.dtype(), t.device());
  write(dense);
  if (!dense.is_same(t)) t.copy_from(dense);
}

// Writes value_of(i) to every element in row-major order.
template <typename Fill>
void fill_in_order(const char* op, const Tensor& t, const Fill& value_of) {
  write_dense(t, [&](const Tensor& dense) {
    ops::dispatch_float(op, t.dtype(), [&]<typename T>() {
      T* p = dense.data<T>();
      for (int64_t i = 0; i < dense.numel(); ++i) p[i] = value_of.template operator()<T>();
    });
  });
}

#if LOCKSTEP_HAVE_CUDA
// Where rng's next word is. Philox keeps its partly used block private; the number of draws
// until its counter moves tells how many of that block's words are left (none when the
// first draw moves it).
ops::cuda::PhiloxPosition next_position(const Philox& rng) {
  Philox probe = rng;
  int draws = 0;
  do {
    probe.next_u32();
    ++draws;
  } while (probe.counter() == rng.counter());
  if (draws == 1) return {rng.seed(), rng.stream(), rng.counter(), 0};
  return {rng.seed(), rng.stream(), rng.counter() - 1, 5 - draws};
}

// Puts rng where drawing `words` words one by one from `at` would leave it.
void skip_words(Philox& rng, const ops::cuda::PhiloxPosition& at, uint64_t words) {
  const uint64_t end = static_cast<uint64_t>(at.first_word) + words;
  rng = Philox(at.seed, at.stream, at.first_block + end / 4);
  for (uint64_t i = 0; i < end % 4; ++i) rng.next_u32();
}

// The GPU's fills, ops::cuda::uniform_fill and normal_fill; both take the CPU fill's two
// parameters (low and high, or mean and stddev).
enum class GpuFill { uniform, normal };

// Fills t on its GPU, element i reading the words from words_per_element · i onwards from
// rng's next word, then moves rng past them all.
void fill_on_gpu(const char* op, const Tensor& t, Philox& rng, GpuFill fill, double a, double b) {
  if (t.numel() == 0) return;
  const uint64_t words_per_element = fill == GpuFill::uniform ? 2 : 4;  // one double, or Box-Muller's two
  const ops::cuda::PhiloxPosition at = next_position(rng);
  write_dense(t, [&](const Tensor& dense) {
    const lockstep::cuda::OnDevice on(dense.device());
    ops::dispatch_float(op, t.dtype(), [&]<typename T>() {
      const auto launch = fill == GpuFill::uniform ? ops::cuda::uniform_fill<T> : ops::cuda::normal_fill<T>;
      launch(dense.data_ptr<T>(), dense.numel(), at, a, b, on.stream());
    });
  });
  skip_words(rng, at, words_per_element * static_cast<uint64_t>(t.numel()));
}
#endif

}  // namespace

void uniform_(const Tensor& t, double low, double high, Philox& rng) {
  LOCKSTEP_CHECK(std::isfinite(low) && std::isfinite(high) && low < high)
      << "uniform_: needs finite low < high, got [" << low << ", " << high << ")";
  check_fill("uniform_", t);
#if LOCKSTEP_HAVE_CUDA
  if (t.device().is_cuda()) return fill_on_gpu("uniform_", t, rng, GpuFill::uniform, low, high);
#endif
  fill_in_order("uniform_", t, [&]<typename T>() {
    const T value = static_cast<T>(low + (high - low) * rng.next_double());
    // Rounding to T may reach `high`; keep the interval half-open.
    return value < static_cast<T>(high) ? value : std::nextafter(static_cast<T>(high), static_cast<T>(low));
  });
}

void normal_(const Tensor& t, double mean, double stddev, Philox& rng) {
  LOCKSTEP_CHECK(std::isfinite(mean) && std::isfinite(stddev) && stddev >= 0)
      << "normal_: needs a finite mean and a finite stddev >= 0, got mean " << mean << ", stddev " << stddev;
  check_fill("normal_", t);
#if LOCKSTEP_HAVE_CUDA
  if (t.device().is_cuda()) return fill_on_gpu("normal_", t, rng, GpuFill::normal, mean, stddev);
#endif
  fill_in_order("normal_", t, [&]<typename T>() { return static_cast<T>(mean + stddev * rng.next_normal()); });
}

}  // namespace lockstep
