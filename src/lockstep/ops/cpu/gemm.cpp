// OpenBLAS runs single-threaded (set once, process-wide, in core/parallel.cpp); large
// products are split here across the caller's OpenMP team instead. Two spinning thread
// pools (OpenMP's and OpenBLAS's pthreads) on the same cores slow each other down many
// times over; with one pool, GEMMs, im2col and elementwise kernels share the same threads.
// Each output element is computed by one thread with the same k-order whatever the split.
#include "lockstep/ops/cpu/gemm.h"

#include <cblas.h>

#include "lockstep/core/parallel.h"

namespace lockstep::cpu {
namespace {

void blas(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void blas(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// Below this many multiply-adds a product runs on the calling thread.
constexpr int64_t kParallelMacs = int64_t{1} << 18;
// Row and column blocks are multiples of this, the register-block sizes of the kernels.
constexpr int64_t kAlign = 16;

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const int64_t threads = omp_in_parallel() ? 1 : num_threads();
  if (threads == 1 || m * n * k < kParallelMacs || (m < 2 * kAlign && n < 2 * kAlign)) {
    blas(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (m >= n) {
    // Rows of C: row i of op(A) is row i of A, or column i when A is transposed.
    const int64_t blocks = (m + kAlign - 1) / kAlign;
    parallel_for(blocks, 1, [&](int64_t begin, int64_t end) {
      const int64_t row = begin * kAlign, rows = std::min(m, end * kAlign) - row;
      blas(trans_a, trans_b, rows, n, k, alpha, a + (trans_a ? row : row * lda), lda, b, ldb, beta, c + row * ldc, ldc);
    });
  } else {
    // Columns of C: column j of op(B) is column j of B, or row j when B is transposed.
    const int64_t blocks = (n + kAlign - 1) / kAlign;
    parallel_for(blocks, 1, [&](int64_t begin, int64_t end) {
      const int64_t col = begin * kAlign, cols = std::min(n, end * kAlign) - col;
      blas(trans_a, trans_b, m, cols, k, alpha, a, lda, b + (trans_b ? col * ldb : col), ldb, beta, c + col, ldc);
    });
  }
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                           int64_t, double, double*, int64_t);

}  // namespace lockstep::cpu
