// Lockstep's own single-precision GEMM for x86-64 CPUs with AVX-512 or AVX2+FMA (the
// instruction set is fixed when the library is compiled: -march=native by default).
//
// Why not OpenBLAS alone: its result for one element of C can change with the shape of the
// call that computes it (its small-matrix kernels, its edge tiles), so a product could only
// be cut into blocks whose shapes depend on the product, never on the team size, and every
// block packed its operands again. Here every element of C is the same sequence of fused
// multiply-adds over k in order, in blocks of k that depend on k alone, whichever part of C
// a call computes and wherever the element falls in a tile. So the product is cut by the
// team size, one thread takes it whole, and the bits stay the same (ops/cpu/gemm.cpp).
#pragma once

#include <cstdint>

namespace lockstep::cpu {

// Whether this build has the kernel (false where the CPU it was compiled for has neither
// AVX-512F nor AVX2 with FMA; gemm.cpp then goes through OpenBLAS).
constexpr bool sgemm_built() {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  return true;
#else
  return false;
#endif
}

// The register tile: rows of A broadcast and columns of B loaded per step. A cut of C at
// multiples of these leaves no partly filled tile inside.
#if defined(__AVX512F__)
constexpr int64_t kSgemmTileRows = 8, kSgemmTileCols = 32;
#else
constexpr int64_t kSgemmTileRows = 6, kSgemmTileCols = 16;
#endif

// C = alpha · op(A) · op(B) + beta · C, row-major like cblas_sgemm, on the calling thread.
// C is not read when beta is 0. With a bias (n values), C = alpha · op(A) · op(B) + the bias
// in every row, beta is ignored and C is not read; the bits are those of C holding the bias
// with beta 1. Requires sgemm_built().
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias = nullptr);

}  // namespace lockstep::cpu
