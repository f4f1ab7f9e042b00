// Intra-op threads. Each CPU device computes with its own small team (OpenMP for our
// kernels, OpenBLAS for GEMM); set_num_threads sets the team size for the calling thread.
#pragma once

#include <algorithm>
#include <cstdint>

namespace lockstep {

void set_num_threads(int threads);
int num_threads();

// Runs body(begin, end) over [0, n) split into contiguous chunks across the team; runs
// inline when the work is small (below grain elements per thread) or inside a team already.
// The team's threads compute under the caller's autocast setting (core/autocast.h), which
// the kernels read per thread.
template <typename Body>
void parallel_for(int64_t n, int64_t grain, const Body& body);

}  // namespace lockstep

#include <omp.h>

#include "lockstep/core/autocast.h"

namespace lockstep {

template <typename Body>
void parallel_for(int64_t n, int64_t grain, const Body& body) {
  if (n <= 0) return;
  const int64_t max_threads = num_threads();
  int64_t threads = grain > 0 ? std::min<int64_t>(max_threads, (n + grain - 1) / grain) : max_threads;
  if (threads <= 1 || omp_in_parallel()) {
    body(int64_t{0}, n);
    return;
  }
  const DType autocast = autocast_dtype();
#pragma omp parallel num_threads(static_cast <int>(threads))
  {
    const AutocastGuard as_the_caller(autocast);
    const int64_t team = omp_get_num_threads();
    const int64_t id = omp_get_thread_num();
    const int64_t chunk = (n + team - 1) / team;
    const int64_t begin = id * chunk;
    const int64_t end = std::min(n, begin + chunk);
    if (begin < end) body(begin, end);
  }
}

}  // namespace lockstep
