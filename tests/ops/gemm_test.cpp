#include "lockstep/ops/cpu/gemm.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "lockstep/core/parallel.h"

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

}  // namespace
}  // namespace lockstep
