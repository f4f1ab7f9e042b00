#include "lockstep/core/parallel.h"

#include <cblas.h>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {
thread_local int tls_threads = 0;  // 0: not set on this thread, use OpenMP's default
}

// OpenBLAS's own pthread pool stays at one thread: ops/cpu/gemm.cpp splits large products
// across this thread's OpenMP team, so only one pool of threads ever spins on the cores.
const bool kBlasSingleThreaded = [] {
  openblas_set_num_threads(1);
  return true;
}();

void set_num_threads(int threads) {
  LOCKSTEP_CHECK(threads >= 1) << "thread count must be at least 1, got " << threads;
  tls_threads = threads;
  omp_set_num_threads(threads);
}

int num_threads() { return tls_threads > 0 ? tls_threads : omp_get_max_threads(); }

}  // namespace lockstep
