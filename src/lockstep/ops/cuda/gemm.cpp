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
// accumulating and writing in f32. An operand already of that type (an activation rounded
// once and kept for backward) is read where it lies.
struct ReducedOperands {
  const void* a = nullptr;  // the operands cuBLAS reads: rounded copies, or reduced operands
  const void* b = nullptr;
  Tensor a_copy, b_copy;             // the rounded copies, held until the product is queued
  cudaDataType_t type = CUDA_R_32F;  // CUDA_R_32F: the product runs in f32 on the operands given
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

// An operand as stored: its elements and their type (f32, or the product's reduced type).
struct Operand {
  const void* data;
  DType dtype;
};

// The product's type: a reduced operand's (both must agree), else autocast's.
DType product_type(Operand a, Operand b) {
  const bool a_reduced = a.dtype != DType::f32, b_reduced = b.dtype != DType::f32;
  LOCKSTEP_CHECK(!a_reduced || !b_reduced || a.dtype == b.dtype)
      << "GEMM on a GPU: operands of " << dtype_name(a.dtype) << " and " << dtype_name(b.dtype)
      << "; a product reads both in one type";
  return a_reduced ? a.dtype : b_reduced ? b.dtype : autocast_dtype();
}

ReducedOperands reduce_operands(bool ta, bool tb, int64_t m, int64_t n, int64_t k, Operand a, int64_t lda,
                                int64_t stride_a, Operand b, int64_t ldb, int64_t stride_b, int64_t batch,
                                Device device, cudaStream_t stream) {
  ReducedOperands r;
  r.a = a.data;
  r.b = b.data;
  const DType dtype = product_type(a, b);
  if (dtype == DType::f32) return r;
  LOCKSTEP_CHECK(dtype == DType::bf16 || dtype == DType::f16)
      << "GEMM on a GPU: an operand of " << dtype_name(dtype) << "; products read f32, bf16 or f16";
  // As stored (row-major): A is [m, k], or [k, m] when transposed; B [k, n] or [n, k].
  if (a.dtype == DType::f32) {
    r.a_copy = rounded_copy(static_cast<const float*>(a.data), span(ta ? k : m, ta ? m : k, lda, stride_a, batch),
                            dtype, device, stream);
    r.a = r.a_copy.data_ptr();
  }
  if (b.dtype == DType::f32) {
    r.b_copy = rounded_copy(static_cast<const float*>(b.data), span(tb ? n : k, tb ? k : n, ldb, stride_b, batch),
                            dtype, device, stream);
    r.b = r.b_copy.data_ptr();
  }
  r.type = dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  return r;
}

void call_gemm(cublasHandle_t h, bool ta, bool tb, const Dims& d, float alpha, const ReducedOperands& r, float beta,
               float* c) {
  const cublasComputeType_t compute = r.type == CUDA_R_32F ? f32_compute() : CUBLAS_COMPUTE_32F;
  LOCKSTEP_CUBLAS_CHECK(cublas().gemm_ex(h, op(tb), op(ta), d.n, d.m, d.k, &alpha, r.b, r.type, d.ldb, r.a, r.type,
                                         d.lda, &beta, c, CUDA_R_32F, d.ldc, compute, CUBLAS_GEMM_DEFAULT));
}

void call_gemm(cublasHandle_t h, bool ta, bool tb, const Dims& d, double alpha, const double* a, const double* b,
               double beta, double* c) {
  LOCKSTEP_CUBLAS_CHECK(cublas().dgemm(h, op(tb), op(ta), d.n, d.m, d.k, &alpha, b, d.ldb, a, d.lda, &beta, c, d.ldc));
}

void call_batched(cublasHandle_t h, bool ta, bool tb, const Dims& d, float alpha, const ReducedOperands& r, int64_t sa,
                  int64_t sb, float beta, float* c, int64_t sc, int batch) {
  const cublasComputeType_t compute = r.type == CUDA_R_32F ? f32_compute() : CUBLAS_COMPUTE_32F;
  LOCKSTEP_CUBLAS_CHECK(cublas().gemm_strided_batched_ex(h, op(tb), op(ta), d.n, d.m, d.k, &alpha, r.b, r.type, d.ldb,
                                                         sb, r.a, r.type, d.lda, sa, &beta, c, CUDA_R_32F, d.ldc, sc,
                                                         batch, compute, CUBLAS_GEMM_DEFAULT));
}

void call_batched(cublasHandle_t h, bool ta, bool tb, const Dims& d, double alpha, const double* a, int64_t sa,
                  const double* b, int64_t sb, double beta, double* c, int64_t sc, int batch) {
  LOCKSTEP_CUBLAS_CHECK(cublas().dgemm_strided_batched(h, op(tb), op(ta), d.n, d.m, d.k, &alpha, b, d.ldb, sb, a, d.lda,
                                                       sa, &beta, c, d.ldc, sc, batch));
}

// f32 output from f32 operands (rounded under autocast) or reduced ones; the batched form
// with batch = 1 is the plain product.
void product_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, Operand a, int64_t lda,
                 int64_t stride_a, Operand b, int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                 int64_t stride_c, int64_t batch, Device device) {
  if (m == 0 || n == 0 || batch == 0) return;
  const Dims dims = checked_dims(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  lockstep::cuda::OnDevice on(device);
  if (empty_inner_product(m, n, k, beta, c, ldc, stride_c, batch, on.stream())) return;
  if (batch > 1) {
    LOCKSTEP_CHECK(stride_c >= m * ldc) << "batched GEMM on a GPU: C's stride " << stride_c
                                        << " is less than m·ldc = " << m * ldc
                                        << ", so the products would overwrite each other";
    LOCKSTEP_CHECK(stride_a > 0 && stride_b > 0)
        << "batched GEMM on a GPU: A's and B's strides (" << stride_a << ", " << stride_b
        << ") must be positive; pass a matrix shared by every product as one [batch·m, k] product instead";
  }
  const ReducedOperands reduced =
      reduce_operands(trans_a, trans_b, m, n, k, a, lda, stride_a, b, ldb, stride_b, batch, device, on.stream());
  if (batch == 1) return call_gemm(cublas_handle(device), trans_a, trans_b, dims, alpha, reduced, beta, c);
  call_batched(cublas_handle(device), trans_a, trans_b, dims, alpha, reduced, stride_a, stride_b, beta, c, stride_c,
               as_int("batch", batch));
}

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc, Device device) {
  if constexpr (std::is_same_v<T, float>) {
    product_f32(trans_a, trans_b, m, n, k, alpha, {a, DType::f32}, lda, 0, {b, DType::f32}, ldb, 0, beta, c, ldc, 0, 1,
                device);
  } else {
    if (m == 0 || n == 0) return;
    const Dims dims = checked_dims(trans_a, trans_b, m, n, k, lda, ldb, ldc);
    lockstep::cuda::OnDevice on(device);
    if (empty_inner_product(m, n, k, beta, c, ldc, 0, 1, on.stream())) return;
    call_gemm(cublas_handle(device), trans_a, trans_b, dims, alpha, a, b, beta, c);
  }
}

template <typename T>
void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                          int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, T beta, T* c, int64_t ldc,
                          int64_t stride_c, int64_t batch, Device device) {
  if (batch == 1) return gemm<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, device);
  if constexpr (std::is_same_v<T, float>) {
    product_f32(trans_a, trans_b, m, n, k, alpha, {a, DType::f32}, lda, stride_a, {b, DType::f32}, ldb, stride_b, beta,
                c, ldc, stride_c, batch, device);
  } else {
    if (m == 0 || n == 0 || batch == 0) return;
    const Dims dims = checked_dims(trans_a, trans_b, m, n, k, lda, ldb, ldc);
    LOCKSTEP_CHECK(stride_c >= m * ldc) << "batched GEMM on a GPU: C's stride " << stride_c
                                        << " is less than m·ldc = " << m * ldc
                                        << ", so the products would overwrite each other";
    lockstep::cuda::OnDevice on(device);
    if (empty_inner_product(m, n, k, beta, c, ldc, stride_c, batch, on.stream())) return;
    LOCKSTEP_CHECK(stride_a > 0 && stride_b > 0)
        << "batched GEMM on a GPU: A's and B's strides (" << stride_a << ", " << stride_b
        << ") must be positive; pass a matrix shared by every product as one [batch·m, k] product instead";
    call_batched(cublas_handle(device), trans_a, trans_b, dims, alpha, a, stride_a, b, stride_b, beta, c, stride_c,
                 as_int("batch", batch));
  }
}

void gemm_mixed(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, DType a_type, int64_t lda,
                int64_t stride_a, const void* b, DType b_type, int64_t ldb, int64_t stride_b, float beta, float* c,
                int64_t ldc, int64_t stride_c, int64_t batch, Device device) {
  product_f32(trans_a, trans_b, m, n, k, 1.0f, {a, a_type}, lda, stride_a, {b, b_type}, ldb, stride_b, beta, c, ldc,
              stride_c, batch, device);
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
