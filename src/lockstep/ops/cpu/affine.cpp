// cpu::affine, apart from the activations in elementwise.cpp: this file compiles with
// -ffp-contract=off (CMakeLists.txt), so alpha * x + beta rounds the product, then the sum,
// as the GPU's kernel does (ops/cuda/elementwise_kernels.cu, compiled with --fmad=false). In
// elementwise.cpp the compiler may fuse them into one multiply-add, and the activations'
// polynomials there want it to.
#include "lockstep/core/parallel.h"
#include "lockstep/ops/cpu/elementwise.h"
#include "lockstep/ops/cpu/reduce.h"

namespace lockstep::cpu {
namespace {

template <typename T, typename F>
void map(const T* x, T* __restrict out, int64_t n, const F& f) {
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = f(x[i]);
  });
}

}  // namespace

template <typename T>
void affine(const T* x, T alpha, T beta, T* out, int64_t n) {
  // The common cases exactly as written (x + beta, alpha * x), signed zeros included.
  if (alpha == T(1)) {
    map(x, out, n, [beta](T v) { return v + beta; });
  } else if (beta == T(0)) {
    map(x, out, n, [alpha](T v) { return alpha * v; });
  } else {
    map(x, out, n, [alpha, beta](T v) { return alpha * v + beta; });
  }
}

template void affine<float>(const float*, float, float, float*, int64_t);
template void affine<double>(const double*, double, double, double*, int64_t);

}  // namespace lockstep::cpu
