#include "lockstep/ops/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "lockstep/core/parallel.h"
#include "lockstep/ops/cpu/sgemm.h"

namespace lockstep {
namespace {

struct Case {
  bool trans_a, trans_b;
  int64_t m, n, k;
};

std::vector<float> random_values(size_t count, uint32_t seed) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = uniform(engine);
  return values;
}

// C = op(A)·op(B) + 0.5·C0 through cpu::gemm with `threads` threads.
std::vector<float> product(const Case& c, int threads) {
  const int64_t lda = c.trans_a ? c.m : c.k, ldb = c.trans_b ? c.k : c.n;
  const std::vector<float> a = random_values(static_cast<size_t>(c.m * c.k), 1);
  const std::vector<float> b = random_values(static_cast<size_t>(c.k * c.n), 2);
  std::vector<float> out = random_values(static_cast<size_t>(c.m * c.n), 3);
  set_num_threads(threads);
  cpu::gemm<float>(c.trans_a, c.trans_b, c.m, c.n, c.k, 1.0f, a.data(), lda, b.data(), ldb, 0.5f, out.data(), c.n);
  return out;
}

// The same product in float64 with plain loops.
std::vector<double> naive_product(const Case& c) {
  const std::vector<float> a = random_values(static_cast<size_t>(c.m * c.k), 1);
  const std::vector<float> b = random_values(static_cast<size_t>(c.k * c.n), 2);
  const std::vector<float> c0 = random_values(static_cast<size_t>(c.m * c.n), 3);
  std::vector<double> out(c0.begin(), c0.end());
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double x = c.trans_a ? a[static_cast<size_t>(p * c.m + i)] : a[static_cast<size_t>(i * c.k + p)];
        const double y = c.trans_b ? b[static_cast<size_t>(j * c.k + p)] : b[static_cast<size_t>(p * c.n + j)];
        sum += x * y;
      }
      out[static_cast<size_t>(i * c.n + j)] = sum + 0.5 * out[static_cast<size_t>(i * c.n + j)];
    }
  }
  return out;
}

// The MLP's products at batch 4 (forward, input gradient, weight gradient of 784→512 and
// 512→512), whose split once followed the team size, and ragged shapes whose last block
// is short, in every transpose combination.
const Case kCases[] = {
    {false, true, 4, 512, 784},  {false, false, 4, 784, 512}, {true, false, 512, 784, 4}, {false, true, 4, 512, 512},
    {false, false, 4, 512, 512}, {true, false, 512, 512, 4},  {true, true, 300, 70, 33},  {false, false, 1000, 24, 40},
    {false, true, 77, 1100, 9},  {true, false, 5, 5, 20000},
};

TEST(Gemm, ProductsDoNotDependOnThreadCount) {
  const int saved = num_threads();
  for (const Case& c : kCases) {
    const std::vector<float> one = product(c, 1);
    for (int threads : {2, 3, 4}) {
      EXPECT_EQ(product(c, threads), one) << c.m << "x" << c.n << "x" << c.k << " op " << (c.trans_a ? "T" : "N")
                                          << (c.trans_b ? "T" : "N") << " on " << threads << " threads";
    }
  }
  set_num_threads(saved);
}

TEST(Gemm, BlockedProductsMatchFloat64Loops) {
  const int saved = num_threads();
  for (const Case& c : kCases) {
    const std::vector<float> got = product(c, 2);
    const std::vector<double> want = naive_product(c);
    ASSERT_EQ(got.size(), want.size());
    const double tolerance = 1e-6 * static_cast<double>(c.k) + 1e-6;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], tolerance) << c.m << "x" << c.n << "x" << c.k << " op " << (c.trans_a ? "T" : "N")
                                              << (c.trans_b ? "T" : "N") << " element " << i;
    }
  }
  set_num_threads(saved);
}

// A bias added as the product is stored gives the bits of C holding it with beta 1, on
// both paths (the kernel's, and OpenBLAS's for the 10-wide product) and any team size.
TEST(Gemm, ABiasGivesTheBitsOfCHoldingItWithBetaOne) {
  const int saved = num_threads();
  for (const Case& c :
       {Case{false, true, 256, 512, 784}, Case{false, true, 70, 10, 600}, Case{true, false, 45, 130, 7}}) {
    const int64_t lda = c.trans_a ? c.m : c.k, ldb = c.trans_b ? c.k : c.n;
    const std::vector<float> a = random_values(static_cast<size_t>(c.m * c.k), 1);
    const std::vector<float> b = random_values(static_cast<size_t>(c.k * c.n), 2);
    const std::vector<float> bias = random_values(static_cast<size_t>(c.n), 4);
    std::vector<float> want(static_cast<size_t>(c.m * c.n));
    for (int64_t i = 0; i < c.m; ++i) std::copy(bias.begin(), bias.end(), want.begin() + i * c.n);
    set_num_threads(1);
    cpu::gemm<float>(c.trans_a, c.trans_b, c.m, c.n, c.k, 1.0f, a.data(), lda, b.data(), ldb, 1.0f, want.data(), c.n);
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      std::vector<float> got(want.size(), std::numeric_limits<float>::quiet_NaN());
      cpu::gemm<float>(c.trans_a, c.trans_b, c.m, c.n, c.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, got.data(), c.n,
                       bias.data());
      EXPECT_EQ(got, want) << c.m << "x" << c.n << "x" << c.k << " on " << threads << " threads";
    }
  }
  set_num_threads(saved);
}

// Any rectangle of C computed on its own, at any offset and of any size (edges inside
// register tiles included), has the bits of the same elements of the whole product: what
// lets gemm cut a product by the team size.
TEST(Sgemm, AnyPartOfCHasTheBitsOfTheWholeProduct) {
  if (!cpu::sgemm_built()) GTEST_SKIP() << "this build has no own single-precision kernel";
  std::mt19937 engine(7);
  for (const Case& c : {Case{false, true, 70, 93, 600}, Case{true, false, 45, 130, 257}, Case{false, false, 33, 77, 5},
                        Case{true, true, 29, 40, 1000}}) {
    const int64_t lda = c.trans_a ? c.m : c.k, ldb = c.trans_b ? c.k : c.n;
    const std::vector<float> a = random_values(static_cast<size_t>(c.m * c.k), 1);
    const std::vector<float> b = random_values(static_cast<size_t>(c.k * c.n), 2);
    const std::vector<float> c0 = random_values(static_cast<size_t>(c.m * c.n), 3);
    for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.75f, 1.0f}, std::pair{-2.0f, 0.5f}}) {
      std::vector<float> whole = c0;
      cpu::sgemm(c.trans_a, c.trans_b, c.m, c.n, c.k, alpha, a.data(), lda, b.data(), ldb, beta, whole.data(), c.n);
      for (int trial = 0; trial < 20; ++trial) {
        const int64_t i0 = std::uniform_int_distribution<int64_t>(0, c.m - 1)(engine);
        const int64_t j0 = std::uniform_int_distribution<int64_t>(0, c.n - 1)(engine);
        const int64_t rows = std::uniform_int_distribution<int64_t>(1, c.m - i0)(engine);
        const int64_t cols = std::uniform_int_distribution<int64_t>(1, c.n - j0)(engine);
        std::vector<float> part = c0;
        cpu::sgemm(c.trans_a, c.trans_b, rows, cols, c.k, alpha, a.data() + (c.trans_a ? i0 : i0 * lda), lda,
                   b.data() + (c.trans_b ? j0 * ldb : j0), ldb, beta, part.data() + i0 * c.n + j0, c.n);
        for (int64_t i = 0; i < c.m; ++i) {
          for (int64_t j = 0; j < c.n; ++j) {
            const bool inside = i >= i0 && i < i0 + rows && j >= j0 && j < j0 + cols;
            const size_t at = static_cast<size_t>(i * c.n + j);
            ASSERT_EQ(part[at], inside ? whole[at] : c0[at])
                << c.m << "x" << c.n << "x" << c.k << " alpha " << alpha << " beta " << beta << ": rows [" << i0 << ", "
                << i0 + rows << ") cols [" << j0 << ", " << j0 + cols << "), element (" << i << ", " << j << ")";
          }
        }
      }
    }
  }
}

// beta 0 overwrites C without reading it (a fresh tensor may hold NaNs); k 0 and alpha 0
// leave beta · C, as BLAS defines them.
TEST(Sgemm, BetaZeroIgnoresCAndEmptySumsScaleIt) {
  if (!cpu::sgemm_built()) GTEST_SKIP() << "this build has no own single-precision kernel";
  const std::vector<float> a = random_values(5 * 3, 1), b = random_values(3 * 40, 2);
  std::vector<float> c(5 * 40, std::numeric_limits<float>::quiet_NaN());
  cpu::sgemm(false, false, 5, 40, 3, 1.0f, a.data(), 3, b.data(), 40, 0.0f, c.data(), 40);
  for (float v : c) ASSERT_FALSE(std::isnan(v));
  std::vector<float> d(5 * 40, 2.0f);
  cpu::sgemm(false, false, 5, 40, 0, 1.0f, a.data(), 3, b.data(), 40, 0.5f, d.data(), 40);
  for (float v : d) ASSERT_EQ(v, 1.0f);
  cpu::sgemm(false, false, 5, 40, 3, 0.0f, a.data(), 3, b.data(), 40, 0.0f, d.data(), 40);
  for (float v : d) ASSERT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace lockstep
