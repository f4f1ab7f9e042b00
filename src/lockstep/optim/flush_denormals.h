// Optimizer state decays geometrically where a parameter's gradient stays zero (a dead
// ReLU unit: AdamW's first moment shrinks by beta1 every step), into subnormal floats. On
// x86 every operation on a subnormal takes a microcode assist of about a hundred cycles:
// a third of the CNN's fc1 moments were subnormal after one epoch, and the optimizer's
// share of the step grew fivefold. The elementwise update loops therefore run with
// flush-to-zero and denormals-are-zero set (on x86), for the calling thread, for the
// guard's lifetime. Every device runs the same loops with the same flags, so the bits stay
// independent of the layout. A moment that would have been subnormal is zero instead (or
// keeps its last normal value, where the decay's small term is what gets flushed), and
// the weights it would have moved (by lr·1e-38/eps at most) do not notice.
#pragma once

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace lockstep::optim {

class FlushDenormals {
 public:
#if defined(__SSE__) || defined(__x86_64__)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
#endif
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
#if defined(__SSE__) || defined(__x86_64__)
  static constexpr unsigned kFlushToZero = 0x8000;       // MXCSR.FTZ: subnormal results become zero
  static constexpr unsigned kDenormalsAreZero = 0x0040;  // MXCSR.DAZ: subnormal inputs read as zero
  unsigned saved_;
#endif
};

}  // namespace lockstep::optim
