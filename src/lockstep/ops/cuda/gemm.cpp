// cuBLAS is column-major; our matrices are row-major. A row-major X[r, c] with leading
// dimension ld is, byte for byte, the column-major matrix Xᵀ[c, r] with the same ld. So
//
//   row-major    C[m, n] = op(A)[m, k] · op(B)[k, n]
//   is           Cᵀ[n, m] = op(B)ᵀ[n, k] · op(A)ᵀ[k, m]   (column-major),
//
// and cuBLAS computes it from the same pointers with the operands swapped and the same
// transpose flags: gemm(opB, opA, n, m, k, alpha, B, ldb, A, lda, beta, C, ldc), where
// opX = T when trans_x. Check for B: without trans_b, B is row-major [k, n] (ldb >= n), which
// column-major is Bᵀ[n, k] with ldb >= n rows: exactly op(B)ᵀ, so cuBLAS's op is N. With
// trans_b, B is stored row-major [n, k] (ldb >= k), which column-major is [k, n] = op(B);
// cuBLAS transposes it (op T) to get op(B)ᵀ[n, k]. The same holds for A, and C (row-major
// [m, n], ldc >= n) is column-major Cᵀ[n, m] with ldc >= n rows.
#include "lockstep/ops/cuda/gemm.h"

#include <algorithm>
#include <climits>
#include <type_traits>

#include "lockstep/core/autocast.h"
#include "lockstep/core/cuda/copy_kernels.h"
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/core/error.h"
#include "lockstep/core/tensor.h"
#include "lockstep/ops/cuda/cublas_handle.h"
#include "lockstep/ops/cuda/cublas_library.h"

namespace lockstep::ops::cuda {
namespace {

// cuBLAS's 32-bit sizes.
int as_int(const char* what, int64_t value) {
  LOCKSTEP_CHECK(value >= 0 && value <= INT_MAX)
      << "GEMM on a GPU: " << what << " = " << value << " does not fit cuBLAS's 32-bit sizes (at most " << INT_MAX
      << "); split the product";
  return static_cast<int>(value);
}

cublasOperation_t op(bool transposed) { return transposed ? CUBLAS_OP_T : CUBLAS_OP_N; }

// TF32 is read per call, as the compute type, so that switching it never touches the
// shared handle.
cublasComputeType_t f32_compute() {
  return lockstep::cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

// The shapes as cuBLAS checks them, with a message that names our (row-major) terms.
struct Dims {
  int m, n, k, lda, ldb, ldc;
};

Dims checked_dims(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
  const int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;  // row lengths as stored
  LOCKSTEP_CHECK(lda >= std::max<int64_t>(1, a_cols) && ldb >= std::max<int64_t>(1, b_cols) &&
                 ldc >= std::max<int64_t>(1, n))
      << "GEMM on a GPU: leading dimensions lda=" << lda << ", ldb=" << ldb << ", ldc=" << ldc
      << " are shorter than the rows they step over (" << a_cols << ", " << b_cols << ", " << n << ")";
  return {as_int("m", m), as_int("n", n), as_int("k", k), as_int("lda", lda), as_int("ldb", ldb), as_int("ldc", ldc)};
}

// With k = 0 the product is empty: C = beta · C. beta = 0 must give zeros even where C holds
// NaN (fresh memory), so that case is a memset rather than left to the library.
template <typename T>
bool empty_inner_product(int64_t m, int64_t n, int64_t k, T beta, T* c, int64_t ldc, int64_t stride_c, int64_t batch,
                         cudaStream_t stream) {
  if (k != 0 || !(beta == T(0) || beta == T(1))) return false;
  if (beta == T(0)) {
    for (int64_t i = 0; i < batch; ++i) {
      LOCKSTEP_CUDA_CHECK(cudaMemset2DAsync(c + i * stride_c, static_cast<size_t>(ldc) * sizeof(T), 0,
                                            static_cast<size_t>(n) * sizeof(T), static_cast<size_t>(m), stream));
    }
  }
  return true;
}

// Under autocast (core/autocast.h), f32 operands are read as bf16 or f16: each is rounded
// once into scratch from the device's allocator (freed blocks are reused in the stream's
// order, after the product has read them), and cuBLAS multiplies them on tensor cores,
// accumulating and writing in f32.
struct ReducedOperands {
  Tensor a, b;  // the rounded copies; undefined when the product runs in f32
  cudaDataType_t type = CUDA_R_32F;
};

// Elements a matrix of `rows` rows of `cols` at leading dimension ld spans, `batch` times
// at `stride`.
int64_t span(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t batch) {
  if (rows == 0 || cols == 0 || batch == 0) return 0;
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

Tensor rounded_copy(const float* x, int64_t count, DType dtype, Device device, cudaStream_t stream) {
  Tensor out = Tensor::empty({count}, dtype, device);
  lockstep::cuda::StridedView from, to;
  from.base = const_cast<float*>(x);
  from.dtype = DType::f32;
  from.strides[0] = 1;
  to.base = out.data_ptr();
  to.dtype = dtype;
  to.strides[0] = 1;
  lockstep::cuda::copy_elements(from, to, &count, 1, count, stream);
  return out;
}

ReducedOperands reduce_operands(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, int64_t batch,
                                Device device, cudaStream_t stream) {
  ReducedOperands r;
  const DType dtype = autocast_dtype();
  if (dtype == DType::f32) return r;
  // As stored (row-major): A is [m, k], or [k, m] when transposed; B [k, n] or [n, k].
  r.a = rounded_copy(a, span(ta ? k : m, ta ? m : k, lda, stride_a, batch), dtype, device, stream);
  r.b = rounded_copy(b, span(tb ? n : k, tb ? k : n, ldb, stride_b, batch), dtype, device, stream);
  r.type = dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  return r;
}

void call_gemm(cublasHandle_t h, bool ta, bool tb, const Dims& d, float alpha, const float* a, const float* b,
               float beta, float* c, const ReducedOperands& reduced) {
  if (reduced.a.defined()) {
    LOCKSTEP_CUBLAS_CHECK(cublas().gemm_ex(h, op(tb), op(ta), d.n, d.m, d.k, &alpha, reduced.b.data_ptr(), reduced.type,
                                           d.ldb, reduced.a.data_ptr(), reduced.type, d.lda, &beta, c, CUDA_R_32F,
                                           d.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  LOCKSTEP_CUBLAS_CHECK(cublas().gemm_ex(h, op(tb), op(ta), d.n, d.m, d.k, &alpha, b, CUDA_R_32F, d.ldb, a, CUDA_R_32F,
                                         d.lda, &beta, c, CUDA_R_32F, d.ldc, f32_compute(), CUBLAS_GEMM_DEFAULT));
}

void call_gemm(cublasHandle_t h, bool ta, bool tb, const Dims& d, double alpha, const double* a, const double* b,
               double beta, double* c, const ReducedOperands&) {
  LOCKSTEP_CUBLAS_CHECK(cublas().dgemm(h, op(tb), op(ta), d.n, d.m, d.k, &alpha, b, d.ldb, a, d.lda, &beta, c, d.ldc));
}

void call_batched(cublasHandle_t h, bool ta, bool tb, const Dims& d, float alpha, const float* a, int64_t sa,
                  const float* b, int64_t sb, float beta, float* c, int64_t sc, int batch,
                  const ReducedOperands& reduced) {
  if (reduced.a.defined()) {
    LOCKSTEP_CUBLAS_CHECK(cublas().gemm_strided_batched_ex(
        h, op(tb), op(ta), d.n, d.m, d.k, &alpha, reduced.b.data_ptr(), reduced.type, d.ldb, sb, reduced.a.data_ptr(),
        reduced.type, d.lda, sa, &beta, c, CUDA_R_32F, d.ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  LOCKSTEP_CUBLAS_CHECK(cublas().gemm_strided_batched_ex(h, op(tb), op(ta), d.n, d.m, d.k, &alpha, b, CUDA_R_32F, d.ldb,
                                                         sb, a, CUDA_R_32F, d.lda, sa, &beta, c, CUDA_R_32F, d.ldc, sc,
                                                         batch, f32_compute(), CUBLAS_GEMM_DEFAULT));
}

void call_batched(cublasHandle_t h, bool ta, bool tb, const Dims& d, double alpha, const double* a, int64_t sa,
                  const double* b, int64_t sb, double beta, double* c, int64_t sc, int batch, const ReducedOperands&) {
  LOCKSTEP_CUBLAS_CHECK(cublas().dgemm_strided_batched(h, op(tb), op(ta), d.n, d.m, d.k, &alpha, b, d.ldb, sb, a, d.lda,
                                                       sa, &beta, c, d.ldc, sc, batch));
}

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc, Device device) {
  if (m == 0 || n == 0) return;
  const Dims dims = checked_dims(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  lockstep::cuda::OnDevice on(device);
  if (empty_inner_product(m, n, k, beta, c, ldc, 0, 1, on.stream())) return;
  ReducedOperands reduced;
  if constexpr (std::is_same_v<T, float>) {
    reduced = reduce_operands(trans_a, trans_b, m, n, k, a, lda, 0, b, ldb, 0, 1, device, on.stream());
  }
  call_gemm(cublas_handle(device), trans_a, trans_b, dims, alpha, a, b, beta, c, reduced);
}

template <typename T>
void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                          int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, T beta, T* c, int64_t ldc,
                          int64_t stride_c, int64_t batch, Device device) {
  if (m == 0 || n == 0 || batch == 0) return;
  if (batch == 1) return gemm<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, device);
  const Dims dims = checked_dims(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  const int count = as_int("batch", batch);
  LOCKSTEP_CHECK(stride_c >= m * ldc) << "batched GEMM on a GPU: C's stride " << stride_c
                                      << " is less than m·ldc = " << m * ldc
                                      << ", so the products would overwrite each other";
  lockstep::cuda::OnDevice on(device);
  if (empty_inner_product(m, n, k, beta, c, ldc, stride_c, batch, on.stream())) return;
  LOCKSTEP_CHECK(stride_a > 0 && stride_b > 0)
      << "batched GEMM on a GPU: A's and B's strides (" << stride_a << ", " << stride_b
      << ") must be positive; pass a matrix shared by every product as one [batch·m, k] product instead";
  ReducedOperands reduced;
  if constexpr (std::is_same_v<T, float>) {
    reduced =
        reduce_operands(trans_a, trans_b, m, n, k, a, lda, stride_a, b, ldb, stride_b, batch, device, on.stream());
  }
  call_batched(cublas_handle(device), trans_a, trans_b, dims, alpha, a, stride_a, b, stride_b, beta, c, stride_c, count,
               reduced);
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t, Device);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                           int64_t, double, double*, int64_t, Device);
template void gemm_strided_batched<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, int64_t,
                                          const float*, int64_t, int64_t, float, float*, int64_t, int64_t, int64_t,
                                          Device);
template void gemm_strided_batched<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                                           int64_t, const double*, int64_t, int64_t, double, double*, int64_t, int64_t,
                                           int64_t, Device);

}  // namespace lockstep::ops::cuda
