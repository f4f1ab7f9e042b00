// The layout follows BLIS and OpenBLAS: op(B) is packed a block of kc × nc at a time into
// panels kNr columns wide (the block stays in L2), op(A) a micro-panel of kMr rows at a time
// (it stays in L1 while every panel of the block streams past it), and a micro-kernel keeps
// a kMr × kNr tile of C in registers over the kc steps, broadcasting A and loading B.
//
// The bits: an element's kc steps are fused multiply-adds from zero in k order; the blocks
// of k are an even split of k (at most kKcMax each), a function of k alone; each block's sum
// is then added to C. Tiles at the edges of C are computed by the same code over operands
// padded with zeros, and masked where they are stored. Nothing depends on m, n, the offset
// of the part of C being computed, or the thread.
#include "lockstep/ops/cpu/sgemm.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>

namespace lockstep::cpu {
namespace {

// A mask of the first `count` of eight 32-bit lanes (count in 0..8), for AVX's masked
// loads and stores.
__m256i first_of_eight(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

#if defined(__AVX512F__)
struct Vec {
  using V = __m512;
  static constexpr int kWidth = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V broadcast(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  // The first `count` lanes (0..kWidth); the rest read as zero and are not written. Masked
  // lanes are never touched, so a short row at the end of an allocation is safe.
  static V load(const float* p, int count) { return _mm512_maskz_loadu_ps(mask(count), p); }
  static void store(float* p, V v, int count) { _mm512_mask_storeu_ps(p, mask(count), v); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }

 private:
  static __mmask16 mask(int count) { return static_cast<__mmask16>((1u << count) - 1u); }
};
#else
struct Vec {
  using V = __m256;
  static constexpr int kWidth = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V broadcast(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V load(const float* p, int count) { return _mm256_maskload_ps(p, first_of_eight(count)); }
  static void store(float* p, V v, int count) { _mm256_maskstore_ps(p, first_of_eight(count), v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
};
#endif

// A tile is two vectors wide. AVX-512: 8 × 32, 16 accumulators of the 32 registers, and per
// step 2 loads of B and 8 broadcasts of A for 16 FMAs. AVX2: 6 × 16, 12 of the 16.
constexpr int kW = Vec::kWidth;
constexpr int kNr = 2 * kW;
constexpr int kMr = static_cast<int>(kSgemmTileRows);
static_assert(kNr == kSgemmTileCols);
// A block of packed B, kKcMax × kNcMax floats (512 KiB with AVX-512), fits in L2 beside C's
// tiles; a micro-panel of A, kMr × kKcMax, in L1.
constexpr int64_t kKcMax = 256;
constexpr int64_t kNcMax = 16 * kNr;

// The lanes of a kNr-wide row that the first and second vector hold, of `cols` in use.
int first_lanes(int64_t cols) { return static_cast<int>(std::min<int64_t>(cols, kW)); }
int second_lanes(int64_t cols) { return static_cast<int>(std::clamp<int64_t>(cols - kW, 0, kW)); }

// What a block of k adds its sums to: in the first block, beta · C or the bias row (when
// there is one); in later blocks, C.
struct Epilogue {
  float alpha, beta;
  const float* bias;  // the tile's first column of the bias row, or null
  bool first;
};

// C[0, rows) × [0, cols) = alpha · (ap · bp) + what e says, where ap holds kc steps of kMr
// values of A and bp kc steps of kNr values of B.
void micro_kernel(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc, int64_t rows, int64_t cols,
                  const Epilogue& e) {
  using V = Vec::V;
  V acc[kMr][2];
  for (int i = 0; i < kMr; ++i) acc[i][0] = acc[i][1] = Vec::zero();
  for (int64_t p = 0; p < kc; ++p, ap += kMr, bp += kNr) {
    const V b0 = Vec::load(bp), b1 = Vec::load(bp + kW);
    for (int i = 0; i < kMr; ++i) {
      const V x = Vec::broadcast(ap[i]);
      acc[i][0] = Vec::fma(x, b0, acc[i][0]);
      acc[i][1] = Vec::fma(x, b1, acc[i][1]);
    }
  }
  const bool full = cols == kNr;
  const int lanes[2] = {first_lanes(cols), second_lanes(cols)};
  const auto load = [&](const float* p, int v) {
    return full ? Vec::load(p + v * kW) : Vec::load(p + v * kW, lanes[v]);
  };
  const bool add_bias = e.first && e.bias != nullptr;
  const bool read_c = !add_bias && (!e.first || e.beta != 0.0f);
  const V va = Vec::broadcast(e.alpha), vb = Vec::broadcast(e.beta);
  V bias[2] = {Vec::zero(), Vec::zero()};
  if (add_bias) bias[0] = load(e.bias, 0), bias[1] = load(e.bias, 1);
  for (int64_t i = 0; i < rows; ++i) {
    float* row = c + i * ldc;
    for (int v = 0; v < 2; ++v) {
      V r = e.alpha == 1.0f ? acc[i][v] : Vec::mul(va, acc[i][v]);
      if (add_bias) r = Vec::add(r, bias[v]);
      if (read_c) {
        V old = load(row, v);
        if (e.first && e.beta != 1.0f) old = Vec::mul(vb, old);
        r = Vec::add(r, old);
      }
      if (full) {
        Vec::store(row + v * kW, r);
      } else {
        Vec::store(row + v * kW, r, lanes[v]);
      }
    }
  }
}

// Transposes the 8 × 8 block rows[0..8) in place (AVX: both builds have it).
[[gnu::always_inline]] inline void transpose8x8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// out[q·ld + i] = src_i[q] for i, q in [0, 8), rows past `rows` read as zeros: eight runs of
// eight floats written as eight columns.
[[gnu::always_inline]] inline void transpose_runs(const float* const src[8], int64_t rows, float* out, int64_t ld) {
  __m256 r[8];
  for (int64_t i = 0; i < 8; ++i) r[i] = i < rows ? _mm256_loadu_ps(src[i]) : _mm256_setzero_ps();
  transpose8x8(r);
  for (int64_t q = 0; q < 8; ++q) _mm256_storeu_ps(out + q * ld, r[q]);
}

// Packs op(B)[0, kc) × [0, nc) (b points at its first element) into panels of kNr columns:
// panel q holds op(B)[p][q·kNr + j] at out[q·kc·kNr + p·kNr + j], zeros past nc.
void pack_b(bool trans_b, const float* b, int64_t ldb, int64_t kc, int64_t nc, float* out) {
  for (int64_t j0 = 0; j0 < nc; j0 += kNr, out += kc * kNr) {
    const int64_t cols = std::min<int64_t>(kNr, nc - j0);
    if (!trans_b) {  // op(B)[p][j] = b[p·ldb + j]: rows of the panel are runs of B's rows.
      const int lanes0 = first_lanes(cols), lanes1 = second_lanes(cols);
      for (int64_t p = 0; p < kc; ++p) {
        const float* src = b + p * ldb + j0;
        Vec::store(out + p * kNr, Vec::load(src, lanes0));
        Vec::store(out + p * kNr + kW, Vec::load(src + kW, lanes1));
      }
      continue;
    }
    // op(B)[p][j] = b[j·ldb + p]: each column of the panel is a run of one of B's rows,
    // transposed eight columns by eight steps at a time.
    const int64_t whole = kc / 8 * 8;
    for (int64_t jb = 0; jb < kNr; jb += 8) {
      const float* src[8];
      for (int64_t j = 0; j < 8; ++j) src[j] = b + std::min(j0 + jb + j, j0 + cols - 1) * ldb;
      const int64_t rows = std::clamp<int64_t>(cols - jb, 0, 8);
      for (int64_t p0 = 0; p0 < whole; p0 += 8) {
        const float* at[8];
        for (int64_t j = 0; j < 8; ++j) at[j] = src[j] + p0;
        transpose_runs(at, rows, out + p0 * kNr + jb, kNr);
      }
      for (int64_t p = whole; p < kc; ++p) {
        for (int64_t j = 0; j < 8; ++j) out[p * kNr + jb + j] = j < rows ? src[j][p] : 0.0f;
      }
    }
  }
}

// Packs op(A)[0, rows) × [0, kc) (a points at its first element) as out[p·kMr + i], zeros
// for rows past `rows`.
void pack_a(bool trans_a, const float* a, int64_t lda, int64_t kc, int64_t rows, float* out) {
  if (trans_a) {  // op(A)[i][p] = a[p·lda + i]: each step is a run of A's row p.
    if constexpr (kMr == 8) {
      const __m256i mask = first_of_eight(rows);
      for (int64_t p = 0; p < kc; ++p) _mm256_storeu_ps(out + p * kMr, _mm256_maskload_ps(a + p * lda, mask));
      return;
    }
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = a + p * lda;
      for (int64_t i = 0; i < kMr; ++i) out[p * kMr + i] = i < rows ? src[i] : 0.0f;
    }
    return;
  }
  // op(A)[i][p] = a[i·lda + p]: row i is a run of A's row i.
  int64_t done = 0;
  if constexpr (kMr == 8) {  // Eight rows by eight steps at a time.
    done = kc / 8 * 8;
    const float* src[8];
    for (int64_t i = 0; i < 8; ++i) src[i] = a + std::min(i, rows - 1) * lda;
    for (int64_t p0 = 0; p0 < done; p0 += 8) {
      const float* at[8];
      for (int64_t i = 0; i < 8; ++i) at[i] = src[i] + p0;
      transpose_runs(at, rows, out + p0 * kMr, kMr);
    }
  }
  for (int64_t i = 0; i < kMr; ++i) {
    if (i < rows) {
      const float* src = a + i * lda;
      for (int64_t p = done; p < kc; ++p) out[p * kMr + i] = src[p];
    } else {
      for (int64_t p = done; p < kc; ++p) out[p * kMr + i] = 0.0f;
    }
  }
}

// Scratch for the packed operands, one set per thread, kept for the thread's life.
struct Packs {
  static constexpr std::align_val_t kAlign{64};
  struct Free {
    void operator()(float* p) const { ::operator delete[](p, kAlign); }
  };
  std::unique_ptr<float[], Free> b{static_cast<float*>(::operator new[](kKcMax* kNcMax * sizeof(float), kAlign))};
  std::unique_ptr<float[], Free> a{static_cast<float*>(::operator new[](kKcMax* kMr * sizeof(float), kAlign))};
};

// C = beta · C, or the bias in every row: the whole product when k is 0 or alpha is 0, as
// BLAS defines it.
void without_product(int64_t m, int64_t n, float beta, float* c, int64_t ldc, const float* bias) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float& x = c[i * ldc + j];
      x = bias != nullptr ? bias[j] : beta == 0.0f ? 0.0f : beta * x;
    }
  }
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || alpha == 0.0f) {
    without_product(m, n, beta, c, ldc, bias);
    return;
  }
  thread_local Packs packs;
  const int64_t k_blocks = (k + kKcMax - 1) / kKcMax;
  const int64_t kc_even = (k + k_blocks - 1) / k_blocks;
  for (int64_t jc = 0; jc < n; jc += kNcMax) {
    const int64_t nc = std::min(kNcMax, n - jc);
    for (int64_t pc = 0; pc < k; pc += kc_even) {
      const int64_t kc = std::min(kc_even, k - pc);
      pack_b(trans_b, trans_b ? b + jc * ldb + pc : b + pc * ldb + jc, ldb, kc, nc, packs.b.get());
      for (int64_t ir = 0; ir < m; ir += kMr) {
        const int64_t rows = std::min<int64_t>(kMr, m - ir);
        pack_a(trans_a, trans_a ? a + pc * lda + ir : a + ir * lda + pc, lda, kc, rows, packs.a.get());
        for (int64_t jr = 0; jr < nc; jr += kNr) {
          const Epilogue e{alpha, beta, bias != nullptr ? bias + jc + jr : nullptr, pc == 0};
          micro_kernel(kc, packs.a.get(), packs.b.get() + jr * kc, c + ir * ldc + jc + jr, ldc, rows,
                       std::min<int64_t>(kNr, nc - jr), e);
        }
      }
    }
  }
}

}  // namespace lockstep::cpu

#else

#include "lockstep/core/error.h"

namespace lockstep::cpu {

void sgemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, float, float*,
           int64_t, const float*) {
  LOCKSTEP_CHECK(false) << "cpu::sgemm: this build has no AVX-512 or AVX2+FMA kernel (see sgemm_built())";
}

}  // namespace lockstep::cpu

#endif
