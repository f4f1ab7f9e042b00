// Row-major GEMM on a CUDA device through cuBLAS, with ops/cpu/gemm.h's contract:
// C = alpha · op(A) · op(B) + beta · C, where op(X) is X or Xᵀ, A is [m, k] after op, B is
// [k, n] after op, C is [m, n], and every matrix is row-major with the given leading
// dimension (the distance between rows as stored). Pointers are device pointers on
// `device`; the product is queued on the device's stream. f32 uses TF32 tensor cores only
// while cuda::allow_tf32() is on, and reads its operands as bf16 or f16 (accumulating in f32)
// under autocast (core/autocast.h). Plain C++ header (no CUDA includes).
#pragma once

#include <cstdint>

#include "lockstep/core/device.h"
#include "lockstep/core/dtype.h"

namespace lockstep::ops::cuda {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc, Device device);

// `batch` independent products of one shape in one call: product i reads a + i·stride_a and
// b + i·stride_b and writes c + i·stride_c (strides in elements). The C matrices must not
// overlap; stride_a and stride_b must be positive when batch > 1.
template <typename T>
void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                          int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, T beta, T* c, int64_t ldc,
                          int64_t stride_c, int64_t batch, Device device);

// An f32 product whose operands are each f32 or of a reduced type (bf16, f16): an
// activation rounded once and kept for backward (ops/linalg.cpp). The product reads both in
// that type — the reduced operand's, else autocast's — rounding an f32 operand to it, as gemm()
// rounds both under autocast; alpha is 1. batch products at the given strides (batch 1: one).
void gemm_mixed(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, DType a_type, int64_t lda,
                int64_t stride_a, const void* b, DType b_type, int64_t ldb, int64_t stride_b, float beta, float* c,
                int64_t ldc, int64_t stride_c, int64_t batch, Device device);

}  // namespace lockstep::ops::cuda
