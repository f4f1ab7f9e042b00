// Matrix products on every test device against float64 loops: the row-major GEMM (cuBLAS on
// CUDA devices, ops/cuda/gemm; OpenBLAS on the CPU) in all four transpose combinations with
// odd shapes and padded leading dimensions, its strided batches, and matmul / linear with
// their gradients over plain, transposed, batched and shared operands.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "lockstep/core/cuda_device.h"
#include "lockstep/ops/cpu/gemm.h"
#include "lockstep/ops/linalg.h"
#include "testing/device_tensors.h"
#include "testing/devices.h"
#include "testing/gradcheck.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/ops/cuda/gemm.h"
#endif

namespace lockstep {
namespace {

using testing::expect_all_close;
using testing::leaf_on;
using testing::random_f64;
using testing::reference_rtol;
using testing::sum_atol;

class CudaGemm : public testing::DeviceTest {};

struct GemmCase {
  bool trans_a, trans_b;
  int64_t m, n, k;
};

// Odd sizes (no multiple of a tile), vectors on either side, k = 1, and k past 1024.
const GemmCase kShapes[] = {{false, false, 37, 53, 29}, {false, false, 1, 67, 13},  {false, false, 45, 1, 7},
                            {false, false, 19, 23, 1},  {false, false, 9, 3, 1031}, {false, false, 130, 77, 65}};

std::vector<GemmCase> every_transpose() {
  std::vector<GemmCase> cases;
  for (GemmCase shape : kShapes) {
    for (int t = 0; t < 4; ++t) {
      shape.trans_a = (t & 1) != 0;
      shape.trans_b = (t & 2) != 0;
      cases.push_back(shape);
    }
  }
  return cases;
}

std::string describe(const GemmCase& c) {
  return std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + " op " +
         (c.trans_a ? "T" : "N") + (c.trans_b ? "T" : "N");
}

// The operands as stored (row-major, each row padded past its length so the leading
// dimensions are not the row lengths): A is [m, k], or [k, m] when transposed; B is [k, n],
// or [n, k]; C is [m, n]. `batch` copies of each, `stride` elements apart.
struct Operands {
  int64_t a_rows, a_cols, lda, b_rows, b_cols, ldb, ldc;
  int64_t stride_a, stride_b, stride_c;
};

Operands layout(const GemmCase& c) {
  Operands o{};
  o.a_rows = c.trans_a ? c.k : c.m;
  o.a_cols = c.trans_a ? c.m : c.k;
  o.b_rows = c.trans_b ? c.n : c.k;
  o.b_cols = c.trans_b ? c.k : c.n;
  o.lda = o.a_cols + 3;
  o.ldb = o.b_cols + 2;
  o.ldc = c.n + 1;
  o.stride_a = o.a_rows * o.lda + 5;
  o.stride_b = o.b_rows * o.ldb + 1;
  o.stride_c = c.m * o.ldc + 4;
  return o;
}

// C = alpha · op(A) · op(B) + beta · C0 for each batch entry, in float64 loops, with the
// padding of C left as it was. `scale` gets Σ |alpha · a · b| + |beta · c0| per element, the
// size rounding errors are measured against.
std::vector<double> naive_gemm(const GemmCase& c, const Operands& o, int64_t batch, double alpha,
                               const std::vector<double>& a, const std::vector<double>& b, double beta,
                               const std::vector<double>& c0, std::vector<double>& scale) {
  std::vector<double> out = c0;
  scale.assign(c0.size(), 0.0);
  for (int64_t e = 0; e < batch; ++e) {
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0, magnitude = 0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double x = a[static_cast<size_t>(e * o.stride_a + (c.trans_a ? p * o.lda + i : i * o.lda + p))];
          const double y = b[static_cast<size_t>(e * o.stride_b + (c.trans_b ? j * o.ldb + p : p * o.ldb + j))];
          sum += x * y;
          magnitude += std::abs(alpha * x * y);
        }
        const size_t at = static_cast<size_t>(e * o.stride_c + i * o.ldc + j);
        out[at] = alpha * sum + beta * c0[at];
        scale[at] = magnitude + std::abs(beta * c0[at]);
      }
    }
  }
  return out;
}

// The product on `device`: cuBLAS for CUDA devices (one strided-batched call when batch > 1),
// OpenBLAS entry by entry on the CPU. Buffers are 1-D tensors on `device`.
template <typename T>
void device_gemm(Device device, const GemmCase& c, const Operands& o, int64_t batch, T alpha, const Tensor& a,
                 const Tensor& b, T beta, const Tensor& out) {
  if (device.is_cpu()) {
    for (int64_t e = 0; e < batch; ++e) {
      cpu::gemm<T>(c.trans_a, c.trans_b, c.m, c.n, c.k, alpha, a.data<T>() + e * o.stride_a, o.lda,
                   b.data<T>() + e * o.stride_b, o.ldb, beta, out.data<T>() + e * o.stride_c, o.ldc);
    }
    return;
  }
#if LOCKSTEP_HAVE_CUDA
  if (batch == 1) {
    ops::cuda::gemm<T>(c.trans_a, c.trans_b, c.m, c.n, c.k, alpha, a.data_ptr<T>(), o.lda, b.data_ptr<T>(), o.ldb, beta,
                       out.data_ptr<T>(), o.ldc, device);
  } else {
    ops::cuda::gemm_strided_batched<T>(c.trans_a, c.trans_b, c.m, c.n, c.k, alpha, a.data_ptr<T>(), o.lda, o.stride_a,
                                       b.data_ptr<T>(), o.ldb, o.stride_b, beta, out.data_ptr<T>(), o.ldc, o.stride_c,
                                       batch, device);
  }
#endif
}

// Runs every case in dtype T, batch entries at a time, and checks each element of C against
// the float64 loops (padding included: it must be untouched).
template <typename T>
void check_gemm_cases(Device device, int64_t batch, double tolerance) {
  const DType dtype = dtype_of<T>();
  uint64_t seed = 100;
  for (const GemmCase& c : every_transpose()) {
    const Operands o = layout(c);
    // Values rounded to T first, so the reference multiplies exactly what the device does.
    const Tensor a = random_f64({batch * o.stride_a}, ++seed).to(dtype);
    const Tensor b = random_f64({batch * o.stride_b}, ++seed).to(dtype);
    const Tensor c0 = random_f64({batch * o.stride_c}, ++seed).to(dtype);
    const T alpha = T(0.75), beta = T(-0.5);
    std::vector<double> scale;
    const std::vector<double> expected = naive_gemm(c, o, batch, alpha, a.to_vector<double>(), b.to_vector<double>(),
                                                    beta, c0.to_vector<double>(), scale);
    const Tensor out = c0.to(device);
    device_gemm<T>(device, c, o, batch, alpha, a.to(device), b.to(device), beta, out);
    const std::vector<double> got = out.to_vector<double>();
    ASSERT_EQ(got.size(), expected.size());
    int64_t wrong = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double allowed = tolerance * scale[i] + 1e-30;
      if (!(std::abs(got[i] - expected[i]) <= allowed) && ++wrong <= 3) {
        ADD_FAILURE() << describe(c) << " batch " << batch << " " << dtype_name(dtype) << ": element " << i << " is "
                      << got[i] << ", expected " << expected[i] << " (within " << allowed << ")";
      }
    }
    EXPECT_EQ(wrong, 0) << describe(c) << " batch " << batch << " " << dtype_name(dtype);
  }
}

TEST_P(CudaGemm, EveryTransposeMatchesFloat64Loops) {
  check_gemm_cases<float>(GetParam(), 1, 1e-5);
  check_gemm_cases<double>(GetParam(), 1, 1e-12);
}

TEST_P(CudaGemm, StridedBatchesMatchFloat64Loops) {
  check_gemm_cases<float>(GetParam(), 3, 1e-5);
  check_gemm_cases<double>(GetParam(), 3, 1e-12);
}

TEST_P(CudaGemm, EmptyInnerDimensionScalesC) {
  const Device device = GetParam();
  const GemmCase c{false, false, 5, 7, 0};
  const Tensor a = Tensor::zeros({1}, DType::f32, device), b = Tensor::zeros({1}, DType::f32, device);
  const Tensor zeroed = Tensor::full({5 * 7}, 7.0, DType::f32, device);
  const Tensor kept = Tensor::full({5 * 7}, 7.0, DType::f32, device);
  const Operands o{5, 0, 1, 0, 7, 7, 7, 0, 0, 0};
  device_gemm<float>(device, c, o, 1, 1.0f, a, b, 0.0f, zeroed);
  device_gemm<float>(device, c, o, 1, 1.0f, a, b, 1.0f, kept);
  EXPECT_EQ(zeroed.to_vector<double>(), std::vector<double>(35, 0.0));
  EXPECT_EQ(kept.to_vector<double>(), std::vector<double>(35, 7.0));
}

// --- matmul and linear ------------------------------------------------------------------

// out[e] = A[e] · B[e] (B shared when b_shared) and the gradients of Σ out · g, in float64:
// grad_a[e] = g[e] · B[e]ᵀ, grad_b[e] = A[e]ᵀ · g[e] (summed over e when B is shared).
struct MatmulRef {
  std::vector<double> out, grad_a, grad_b;
};

MatmulRef naive_matmul(const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& g,
                       int64_t batch, int64_t m, int64_t k, int64_t n, bool b_shared) {
  MatmulRef r{std::vector<double>(static_cast<size_t>(batch * m * n)), std::vector<double>(a.size()),
              std::vector<double>(b.size())};
  for (int64_t e = 0; e < batch; ++e) {
    const int64_t ea = e * m * k, eb = b_shared ? 0 : e * k * n, eo = e * m * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t p = 0; p < k; ++p) {
          const size_t ai = static_cast<size_t>(ea + i * k + p), bi = static_cast<size_t>(eb + p * n + j);
          const size_t oi = static_cast<size_t>(eo + i * n + j);
          r.out[oi] += a[ai] * b[bi];
          r.grad_a[ai] += g[oi] * b[bi];
          r.grad_b[bi] += a[ai] * g[oi];
        }
  }
  return r;
}

// A leaf on `device` holding `values` (logical order); `transposed` stores the last two axes
// swapped and returns the transposed view of that storage.
Tensor operand_on(Device device, const Tensor& values, bool transposed) {
  if (!transposed) return leaf_on(values, device);
  const int64_t d = values.dim();
  Shape shape = values.shape();
  std::swap(shape[static_cast<size_t>(d - 1)], shape[static_cast<size_t>(d - 2)]);
  Tensor swapped = Tensor::empty(shape, values.dtype());
  Strides strides = swapped.strides();
  std::swap(strides[static_cast<size_t>(d - 1)], strides[static_cast<size_t>(d - 2)]);
  swapped.as_strided(values.shape(), strides, 0).copy_from(values);
  Tensor stored = swapped.to(device).as_strided(values.shape(), strides, 0);
  stored.set_requires_grad(true);
  return stored;
}

struct MatmulCase {
  int64_t batch;  // 0: a 2-D product
  int64_t m, k, n;
  bool b_shared, trans_a, trans_b;
};

TEST_P(CudaGemm, MatmulAndGradientsMatchFloat64Loops) {
  const Device device = GetParam();
  const MatmulCase cases[] = {
      {0, 37, 29, 53, false, false, false}, {0, 37, 29, 53, false, true, false}, {0, 37, 29, 53, false, false, true},
      {0, 1, 1100, 3, false, true, true},   {5, 7, 11, 13, false, false, false}, {5, 7, 11, 13, false, true, true},
      {1, 9, 4, 6, false, false, true},     {4, 6, 9, 10, true, false, false},   {4, 6, 9, 10, true, true, true},
  };
  uint64_t seed = 1;
  for (const MatmulCase& c : cases) {
    for (DType dtype : {DType::f32, DType::f64}) {
      const int64_t batch = std::max<int64_t>(c.batch, 1);
      const Shape a_shape = c.batch ? Shape{c.batch, c.m, c.k} : Shape{c.m, c.k};
      const Shape b_shape = c.b_shared ? Shape{c.k, c.n} : c.batch ? Shape{c.batch, c.k, c.n} : Shape{c.k, c.n};
      const Tensor a_values = random_f64(a_shape, ++seed).to(dtype);
      const Tensor b_values = random_f64(b_shape, ++seed).to(dtype);
      const Tensor a = operand_on(device, a_values, c.trans_a), b = operand_on(device, b_values, c.trans_b);
      const Tensor out = matmul(a, b);
      ASSERT_EQ(out.device(), device);
      const Tensor g = random_f64(out.shape(), ++seed).to(dtype);
      out.backward(g.to(device));
      const MatmulRef ref = naive_matmul(a_values.to_vector<double>(), b_values.to_vector<double>(),
                                         g.to_vector<double>(), batch, c.m, c.k, c.n, c.b_shared);
      SCOPED_TRACE(shape_str(a_shape) + " @ " + shape_str(b_shape) + (c.trans_a ? " A viewed transposed" : "") +
                   (c.trans_b ? " B viewed transposed" : "") + " " + dtype_name(dtype));
      expect_all_close(out.to(Device::cpu()), ref.out, reference_rtol(dtype), sum_atol(dtype, c.k));
      expect_all_close(a.grad().to(Device::cpu()), ref.grad_a, reference_rtol(dtype), sum_atol(dtype, c.n));
      expect_all_close(b.grad().to(Device::cpu()), ref.grad_b, reference_rtol(dtype), sum_atol(dtype, batch * c.m));
    }
  }
}

// Batches whose entries are not evenly spaced BLAS matrices, or that all share one matrix
// (batch stride 0), take the copying path; padded batch strides stay views.
TEST_P(CudaGemm, MatmulOfOddlyStridedBatches) {
  const Device device = GetParam();
  const int64_t batch = 3, m = 5, k = 7, n = 4;
  const Tensor a_base = random_f64({m * k}, 40).to(device);
  const Tensor a_shared = a_base.as_strided({batch, m, k}, {0, k, 1}, 0);  // one matrix for every entry
  const Tensor b_base = random_f64({batch * (k * n + 3)}, 41).to(device);
  const Tensor b_padded = b_base.as_strided({batch, k, n}, {k * n + 3, n, 1}, 0);
  const Tensor b_columns = b_base.as_strided({batch, k, n}, {1, batch * n, batch}, 0);  // neither layout
  for (const Tensor& b : {b_padded, b_columns}) {
    const Tensor out = matmul(a_shared, b);
    const auto av = a_shared.to_vector<double>(), bv = b.to_vector<double>();
    const MatmulRef ref =
        naive_matmul(av, bv, std::vector<double>(static_cast<size_t>(batch * m * n)), batch, m, k, n, false);
    expect_all_close(out.to(Device::cpu()), ref.out, 1e-12, 1e-13);
  }
  // [B, m, k] @ [k, n] where A's rows are not evenly spaced across entries.
  const Tensor a_gapped =
      random_f64({batch * (m * k + 2)}, 42).to(device).as_strided({batch, m, k}, {m * k + 2, k, 1}, 0);
  const Tensor b2 = random_f64({k, n}, 43).to(device);
  const MatmulRef ref = naive_matmul(a_gapped.to_vector<double>(), b2.to_vector<double>(),
                                     std::vector<double>(static_cast<size_t>(batch * m * n)), batch, m, k, n, true);
  expect_all_close(matmul(a_gapped, b2).to(Device::cpu()), ref.out, 1e-12, 1e-13);
}

TEST_P(CudaGemm, MatmulWithAnEmptyInnerDimensionIsZero) {
  const Device device = GetParam();
  const Tensor a = Tensor::zeros({2, 3, 0}, DType::f32, device), b = Tensor::zeros({2, 0, 4}, DType::f32, device);
  EXPECT_EQ(matmul(a, b).to_vector<double>(), std::vector<double>(24, 0.0));
  EXPECT_EQ(
      matmul(Tensor::zeros({3, 0}, DType::f64, device), Tensor::zeros({0, 5}, DType::f64, device)).to_vector<double>(),
      std::vector<double>(15, 0.0));
  EXPECT_EQ(matmul(Tensor::zeros({0, 4}, DType::f32, device), Tensor::zeros({4, 5}, DType::f32, device)).shape(),
            (Shape{0, 5}));
}

TEST_P(CudaGemm, LinearAndGradientsMatchFloat64Loops) {
  const Device device = GetParam();
  const int64_t in = 37, out_features = 29;
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor x_values = random_f64({3, 5, in}, 50).to(dtype);
    const Tensor w_values = random_f64({out_features, in}, 51).to(dtype);
    const Tensor b_values = random_f64({out_features}, 52).to(dtype);
    const Tensor x = operand_on(device, x_values, false), w = operand_on(device, w_values, false);
    const Tensor b = operand_on(device, b_values, false);
    const Tensor y = linear(x, w, b);
    EXPECT_EQ(y.shape(), (Shape{3, 5, out_features}));
    const Tensor g = random_f64(y.shape(), 53).to(dtype);
    y.backward(g.to(device));
    // linear is x · wᵀ: the product of [15, in] and wᵀ [in, out] with B = wᵀ.
    const auto wv = w_values.to_vector<double>();
    std::vector<double> wt(wv.size());
    for (int64_t o = 0; o < out_features; ++o)
      for (int64_t i = 0; i < in; ++i)
        wt[static_cast<size_t>(i * out_features + o)] = wv[static_cast<size_t>(o * in + i)];
    const MatmulRef ref =
        naive_matmul(x_values.to_vector<double>(), wt, g.to_vector<double>(), 1, 15, in, out_features, false);
    std::vector<double> expected = ref.out, grad_w(wv.size()), grad_b(static_cast<size_t>(out_features));
    const auto bv = b_values.to_vector<double>(), gv = g.to_vector<double>();
    for (size_t i = 0; i < expected.size(); ++i) {
      expected[i] += bv[i % static_cast<size_t>(out_features)];
      grad_b[i % static_cast<size_t>(out_features)] += gv[i];
    }
    for (int64_t o = 0; o < out_features; ++o)
      for (int64_t i = 0; i < in; ++i)
        grad_w[static_cast<size_t>(o * in + i)] = ref.grad_b[static_cast<size_t>(i * out_features + o)];
    SCOPED_TRACE(dtype_name(dtype));
    expect_all_close(y.to(Device::cpu()), expected, reference_rtol(dtype), sum_atol(dtype, in));
    expect_all_close(x.grad().to(Device::cpu()), ref.grad_a, reference_rtol(dtype), sum_atol(dtype, out_features));
    expect_all_close(w.grad().to(Device::cpu()), grad_w, reference_rtol(dtype), sum_atol(dtype, 15));
    expect_all_close(b.grad().to(Device::cpu()), grad_b, reference_rtol(dtype), sum_atol(dtype, 15));
  }
}

// Same inputs, same bits: the handle's fixed workspace keeps cuBLAS's choice of algorithm.
TEST_P(CudaGemm, ProductsRepeatBitForBit) {
  const Device device = GetParam();
  auto run = [&] {
    const Tensor a = operand_on(device, random_f64({8, 96, 200}, 60).to(DType::f32), false);
    const Tensor b = operand_on(device, random_f64({8, 200, 72}, 61).to(DType::f32), true);
    const Tensor out = matmul(a, b);
    out.backward(random_f64(out.shape(), 62).to(DType::f32).to(device));
    return std::vector<std::vector<float>>{out.to_vector<float>(), a.grad().to_vector<float>(),
                                           b.grad().to_vector<float>()};
  };
  const auto first = run();
  EXPECT_EQ(run(), first);
}

// TF32 rounds the products' inputs to a 10-bit mantissa: results stay within that precision
// of the float64 product, and switching it back off restores full f32.
TEST_P(CudaGemm, Tf32StaysWithinItsPrecision) {
  const Device device = GetParam();
  struct Tf32 {
    explicit Tf32(bool on) : saved(cuda::allow_tf32()) { cuda::set_allow_tf32(on); }
    ~Tf32() { cuda::set_allow_tf32(saved); }
    bool saved;
  };
  const int64_t m = 64, k = 512, n = 48;
  const Tensor a = random_f64({m, k}, 70).to(DType::f32), b = random_f64({k, n}, 71).to(DType::f32);
  const MatmulRef ref = naive_matmul(a.to_vector<double>(), b.to_vector<double>(),
                                     std::vector<double>(static_cast<size_t>(m * n)), 1, m, k, n, false);
  {
    Tf32 on(true);
    // |error| <= 2^-10 relative per product, summed over k products of magnitude <= 1.
    expect_all_close(matmul(a.to(device), b.to(device)).to(Device::cpu()), ref.out, 0, 2e-3 * std::sqrt(double(k)));
  }
  Tf32 off(false);
  expect_all_close(matmul(a.to(device), b.to(device)).to(Device::cpu()), ref.out, 1e-5, sum_atol(DType::f32, k));
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaGemm, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep
