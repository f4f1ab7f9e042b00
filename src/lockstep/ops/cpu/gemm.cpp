// OpenBLAS runs single-threaded (set once, process-wide, in core/parallel.cpp); large
// products are split here across the caller's OpenMP team instead. Two spinning thread
// pools (OpenMP's and OpenBLAS's pthreads) on the same cores slow each other down many
// times over; with one pool, GEMMs, im2col and elementwise kernels share the same threads.
//
// Single precision goes through Lockstep's own kernel where the build has one (sgemm.h) and
// the shape suits it: its bits do not depend on how the product is cut, so it is cut into
// one block per thread of the team, along the dimension whose cut repacks the smaller
// operand.
//
// Everything else (double precision, and the shapes the kernel leaves) goes through
// OpenBLAS, whose cut must depend on the shape alone, never on the team size: OpenBLAS may
// compute the same output element with other bits in a call of another size (its kernels
// for small matrices, its edge tiles), and a device's results must not change with the
// number of threads it computes with (the step-is-a-tree guarantee of data parallelism).
// Measured with OpenBLAS 0.3.21: one call against the same product cut at multiples of 16
// rows or columns differed in some bits for 36 of 400 random shapes with its SkylakeX
// kernels and 310 of 400 with its Haswell ones.
#include "lockstep/ops/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <type_traits>
#include <vector>

#include "lockstep/core/autocast.h"
#include "lockstep/core/half_bits.h"
#include "lockstep/core/parallel.h"
#include "lockstep/ops/cpu/sgemm.h"

namespace lockstep::cpu {
namespace {

// Under autocast an f32 product reads its operands rounded to bf16 or f16, as a GPU's
// tensor cores do; the CPU then multiplies those values in f32, where the product of two of
// them is exact. The rows x cols matrix at x (leading dimension ld), rounded into a dense one.
std::vector<float> rounded(const float* x, int64_t rows, int64_t cols, int64_t ld, DType type) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  parallel_for(rows, std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(cols, 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t r = begin; r < end; ++r) {
                   const float* from = x + r * ld;
                   float* to = out.data() + r * cols;
                   if (type == DType::bf16) {
                     for (int64_t c = 0; c < cols; ++c) to[c] = bf16_to_f32(f32_to_bf16(from[c]));
                   } else {
                     for (int64_t c = 0; c < cols; ++c) to[c] = f16_to_f32(f32_to_f16(from[c]));
                   }
                 }
               });
  return out;
}

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

// A part of C through OpenBLAS: with a bias, C first holds it in every row and beta is 1.
template <typename T>
void blas_part(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
               int64_t ldb, T beta, T* c, int64_t ldc, const T* bias) {
  if (bias != nullptr) {
    for (int64_t i = 0; i < m; ++i) std::copy(bias, bias + n, c + i * ldc);
    beta = T(1);
  }
  blas(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Below this many multiply-adds a product is one call.
constexpr int64_t kParallelMacs = int64_t{1} << 18;
// Blocks of rows (or columns) of C: a power-of-two count of them (so teams of 2, 4, ...
// get equal shares), each at least kMinBlock wide so a call amortizes packing its operands
// (every call packs the other operand again), at most kMaxBlocks, widths a multiple of the
// kernels' register block.
constexpr int64_t kAlign = 16;
constexpr int64_t kMinBlock = 128;
constexpr int64_t kMaxBlocks = 16;

int64_t block_size(int64_t extent) {
  const int64_t blocks =
      std::min(kMaxBlocks,
               static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(std::max<int64_t>(1, extent / kMinBlock)))));
  const int64_t even = (extent + blocks - 1) / blocks;
  return (even + kAlign - 1) / kAlign * kAlign;
}

// Lockstep's kernel takes a product whose C is at least a register tile wide and whose sums
// are at least kOwnMinDepth long; OpenBLAS the rest. Narrower C leaves most of each vector
// idle, shorter sums spend their time packing and storing. One thread against OpenBLAS
// 0.3.21 (Zen 4): the MLP's and conv2's products 1.00-1.10x as fast, conv1's 32x2704x9
// 0.66x and 32x9x2704 0.26x, the MLP's 256x10x512 0.6x. The choice follows the whole
// product's shape, before any cut, so each product always takes the same path.
constexpr int64_t kOwnMinDepth = 32;

bool own_kernel_takes(int64_t n, int64_t k) { return sgemm_built() && n >= kSgemmTileCols && k >= kOwnMinDepth; }

// Runs `product` (a GEMM with gemm's arguments) over blocks of `block` rows of C (by_rows)
// or columns, across the team: each block on the slices of A or B, C and the bias it
// covers. Row i of op(A) is row i of A, or column i when A is transposed; column j of
// op(B) is column j of B, or row j when B is transposed. Inside a team already (a conv
// chunk per thread), parallel_for runs the blocks inline.
template <typename T, typename Product>
void over_blocks(bool by_rows, int64_t block, const Product& product, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                 T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc, const T* bias) {
  const int64_t extent = by_rows ? m : n;
  parallel_for((extent + block - 1) / block, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t first = i * block, size = std::min(extent, first + block) - first;
      if (by_rows) {
        product(ta, tb, size, n, k, alpha, a + (ta ? first : first * lda), lda, b, ldb, beta, c + first * ldc, ldc,
                bias);
      } else {
        product(ta, tb, m, size, k, alpha, a, lda, b + (tb ? first * ldb : first), ldb, beta, c + first, ldc,
                bias != nullptr ? bias + first : nullptr);
      }
    }
  });
}

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc, const T* bias) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (const DType reduced = autocast_dtype(); reduced != DType::f32) {
      // As stored: A is [m, k], or [k, m] when transposed; B [k, n] or [n, k].
      const int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
      const std::vector<float> ra = rounded(a, trans_a ? k : m, a_cols, lda, reduced);
      const std::vector<float> rb = rounded(b, trans_b ? n : k, b_cols, ldb, reduced);
      const AutocastGuard rounded_already(DType::f32);
      return gemm<float>(trans_a, trans_b, m, n, k, alpha, ra.data(), std::max<int64_t>(a_cols, 1), rb.data(),
                         std::max<int64_t>(b_cols, 1), beta, c, ldc, bias);
    }
  }
  // Rows of C when it has at least as many rows as columns (each block packs all of B
  // again), else columns (each packs all of A again).
  const bool by_rows = m >= n;
  const int64_t extent = by_rows ? m : n;
  const bool small = m * n * k < kParallelMacs;
  if constexpr (std::is_same_v<T, float>) {
    if (own_kernel_takes(n, k)) {  // One block per thread of the team.
      const int64_t team = small || omp_in_parallel() ? 1 : num_threads();
      const int64_t tile = by_rows ? kSgemmTileRows : kSgemmTileCols;
      const int64_t block = ((extent + team - 1) / team + tile - 1) / tile * tile;
      over_blocks(by_rows, block, sgemm, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias);
      return;
    }
  }
  over_blocks(by_rows, small ? extent : block_size(extent), blas_part<T>, trans_a, trans_b, m, n, k, alpha, a, lda, b,
              ldb, beta, c, ldc, bias);
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t, const float*);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                           int64_t, double, double*, int64_t, const double*);

}  // namespace lockstep::cpu
