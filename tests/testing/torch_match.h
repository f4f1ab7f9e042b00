// Comparing Lockstep's float32 results with PyTorch's fixtures (the CNN, the MLP, the GPT).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "lockstep/core/tensor.h"

namespace lockstep::testing {

// Tolerance: |got - want| <= kRtol * |want| + kAtol * max|want over the tensor|. The reference
// is PyTorch in float64 rounded to float32, so the difference is Lockstep's own float32
// rounding. A reduced value (a dot product, a gradient summed over batch and positions)
// carries an error proportional to the size of the terms summed, not of the result, which
// can cancel to near zero; the tensor's largest element stands for the size of the terms,
// hence the floor. PyTorch's own float32 run uses about 5% of this budget (the script
// refuses a fixture where it needs over 25%, or where a ReLU input or max-pool tie lies
// within float32 noise, which a correct implementation could legitimately resolve the other
// way). Any real defect (a transposed weight, a missed term, a wrong step) is off by a sizeable
// fraction of the largest element; an lr of 0.1001 instead of 0.1 already fails.
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-5;

// One failure per tensor, naming how many elements are off and the worst one.
inline void expect_matches(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": Lockstep produced no tensor";
  ASSERT_EQ(got.shape(), want.shape()) << what << ": shape " << shape_str(got.shape()) << ", PyTorch has "
                                       << shape_str(want.shape());
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double scale = 0;
  for (const double v : w) scale = std::max(scale, std::abs(v));
  int64_t bad = 0;
  size_t worst = 0;
  double worst_ratio = 0;
  for (size_t k = 0; k < w.size(); ++k) {
    const double ratio = std::abs(g[k] - w[k]) / (kRtol * std::abs(w[k]) + kAtol * scale);
    if (!(ratio <= 1)) ++bad;  // NaN counts as bad
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = k;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << w.size()
                    << " elements differ from PyTorch; worst at flat index " << worst << ": Lockstep " << g[worst]
                    << ", PyTorch " << w[worst] << " (largest |PyTorch| " << scale << ", " << worst_ratio
                    << "x the tolerance)";
}

}  // namespace lockstep::testing
