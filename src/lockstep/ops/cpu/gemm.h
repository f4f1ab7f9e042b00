// Row-major GEMM on the CPU, C = alpha · op(A) · op(B) + beta · C, across the calling
// thread's team: through Lockstep's own single-precision kernel (sgemm.h) or OpenBLAS, with
// bits that do not depend on the team size (gemm.cpp).
#pragma once

#include <cstdint>

namespace lockstep::cpu {

// With a bias (n values, beta 0): C = alpha · op(A) · op(B) + the bias in every row, with the
// bits of C holding the bias and beta 1, without writing C twice where the kernel allows.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc, const T* bias = nullptr);

}  // namespace lockstep::cpu
