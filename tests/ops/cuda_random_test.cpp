// Random fills and dropout masks on every test device against the CPU's Philox: the words,
// the uniform values and the masks must be the same bits; normal values may differ only in
// the last bits of log and cos. Each case also checks the values against formulas on
// philox4x32 written out here, so the CPU case tests something of its own.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "lockstep/core/philox.h"
#include "lockstep/ops/dropout.h"
#include "lockstep/ops/random.h"
#include "lockstep/ops/shape_ops.h"
#include "testing/devices.h"
#include "testing/gradcheck.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/ops/cuda/random_kernels.h"
#endif

namespace lockstep {
namespace {

using testing::random_f64;

template <typename T>
using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;

template <typename T>
void expect_same_bits(const std::vector<T>& actual, const std::vector<T>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    ASSERT_EQ(std::bit_cast<Bits<T>>(actual[i]), std::bit_cast<Bits<T>>(expected[i]))
        << "element " << i << ": " << actual[i] << " against " << expected[i];
}

// Two generators are in the same state when they have the same counter and draw the same words.
void expect_same_state(Philox a, Philox b) {
  EXPECT_EQ(a.counter(), b.counter());
  for (int i = 0; i < 9; ++i) ASSERT_EQ(a.next_u32(), b.next_u32()) << "draw " << i << " after the fill";
}

#if LOCKSTEP_HAVE_CUDA
TEST(CudaPhilox, WordsAreTheCpusBitForBit) {
  const Device device(DeviceType::cuda, 0);
  LOCKSTEP_SKIP_UNLESS_DEVICE(device);
  struct Key {
    uint64_t seed, stream, first_counter;
  };
  // Counters across the low word's wrap and near the top of the range; keys with high bits.
  const std::vector<Key> keys = {{0, 0, 0},
                                 {42, static_cast<uint64_t>(RngStream::init), 0xFFFFFFF0u},
                                 {0xDEADBEEFCAFEF00Dull, dropout_stream(5, 123), (uint64_t{1} << 63) - 10},
                                 {~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0} - 20}};
  constexpr int64_t kBlocks = 40;
  for (const Key& key : keys) {
    SCOPED_TRACE("seed " + std::to_string(key.seed) + " stream " + std::to_string(key.stream));
    const Tensor words = Tensor::empty({4 * kBlocks}, DType::i32, device);
    {
      const cuda::OnDevice on(device);
      ops::cuda::philox_blocks(key.seed, key.stream, key.first_counter, kBlocks,
                               reinterpret_cast<uint32_t*>(words.data_ptr<int32_t>()), on.stream());
    }
    const auto got = words.to_vector<int32_t>();
    for (int64_t i = 0; i < kBlocks; ++i) {
      const auto expected = philox4x32(key.seed, key.stream, key.first_counter + static_cast<uint64_t>(i));
      for (int w = 0; w < 4; ++w)
        ASSERT_EQ(static_cast<uint32_t>(got[static_cast<size_t>(4 * i + w)]), expected[static_cast<size_t>(w)])
            << "block " << i << " word " << w;
    }
  }
}
#endif

class CudaRandom : public testing::DeviceTest {};

// A generator partway through a block when predraws is not a multiple of 4.
Philox generator_after(uint64_t seed, int predraws) {
  Philox rng(seed, static_cast<uint64_t>(RngStream::init), 1000);
  for (int i = 0; i < predraws; ++i) rng.next_u32();
  return rng;
}

template <typename T>
void expect_uniform_like_cpu(Device device) {
  for (int predraws : {0, 1, 2, 3, 6}) {
    for (const Shape& shape : {Shape{1001}, Shape{3, 257}, Shape{1}}) {
      SCOPED_TRACE(shape_str(shape) + " after " + std::to_string(predraws) + " draws " + dtype_name(dtype_of<T>()));
      Philox cpu_rng = generator_after(9, predraws), device_rng = cpu_rng, reference = cpu_rng;
      const Tensor on_cpu = Tensor::empty(shape, dtype_of<T>());
      const Tensor on_device = Tensor::empty(shape, dtype_of<T>(), device);
      uniform_(on_cpu, -2, 3, cpu_rng);
      uniform_(on_device, -2, 3, device_rng);
      const auto expected = on_cpu.to_vector<T>();
      expect_same_bits(on_device.to_vector<T>(), expected);
      expect_same_state(device_rng, cpu_rng);
      // Two words per element in stream order. Whether low + span · u is fused or not moves
      // it by up to an ulp of span · u, which is several ulp of a result near 0.
      const double tolerance = 4 * std::numeric_limits<T>::epsilon() * 5;
      for (size_t i = 0; i < expected.size(); ++i)
        ASSERT_NEAR(expected[i], static_cast<T>(-2 + 5 * reference.next_double()), tolerance) << "element " << i;
      expect_same_state(reference, cpu_rng);
    }
  }
}

TEST_P(CudaRandom, UniformFillsAreTheCpusBitForBit) {
  expect_uniform_like_cpu<float>(GetParam());
  expect_uniform_like_cpu<double>(GetParam());
}

template <typename T>
void expect_normal_like_cpu(Device device) {
  // log and cos differ in the last bits between libm and CUDA: one or two ulp of z.
  const double tolerance = std::is_same_v<T, float> ? 1e-6 : 1e-13;
  for (int predraws : {0, 1, 2, 3}) {
    SCOPED_TRACE("after " + std::to_string(predraws) + " draws " + dtype_name(dtype_of<T>()));
    Philox cpu_rng = generator_after(10, predraws), device_rng = cpu_rng, reference = cpu_rng;
    const Tensor on_cpu = Tensor::empty({5, 201}, dtype_of<T>());
    const Tensor on_device = Tensor::empty({5, 201}, dtype_of<T>(), device);
    normal_(on_cpu, 0.5, 2.0, cpu_rng);
    normal_(on_device, 0.5, 2.0, device_rng);
    const auto expected = on_cpu.to_vector<T>();
    const auto got = on_device.to_vector<T>();
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], expected[i], tolerance * (1 + std::abs(expected[i]))) << "element " << i;
      ASSERT_NEAR(expected[i], 0.5 + 2.0 * reference.next_normal(), tolerance * (1 + std::abs(expected[i])))
          << "element " << i;
    }
    expect_same_state(device_rng, cpu_rng);
    expect_same_state(reference, cpu_rng);
  }
}

TEST_P(CudaRandom, NormalFillsMatchTheCpuToRounding) {
  expect_normal_like_cpu<float>(GetParam());
  expect_normal_like_cpu<double>(GetParam());
}

TEST_P(CudaRandom, StridedViewsFillInTheirOwnElementOrder) {
  const Device device = GetParam();
  const Tensor cpu_base = Tensor::zeros({7, 13}, DType::f32);
  const Tensor device_base = Tensor::zeros({7, 13}, DType::f32, device);
  Philox cpu_rng = generator_after(3, 1), device_rng = cpu_rng;
  uniform_(transpose(cpu_base, 0, 1), 0, 1, cpu_rng);
  uniform_(transpose(device_base, 0, 1), 0, 1, device_rng);
  expect_same_bits(device_base.to_vector<float>(), cpu_base.to_vector<float>());
  expect_same_state(device_rng, cpu_rng);
  // Element (i, j) of the view, i.e. base (j, i), holds draw i * 7 + j.
  Philox reference = generator_after(3, 1);
  const auto base = cpu_base.to_vector<float>();
  for (int64_t i = 0; i < 13; ++i)
    for (int64_t j = 0; j < 7; ++j)
      ASSERT_FLOAT_EQ(base[static_cast<size_t>(j * 13 + i)], static_cast<float>(reference.next_double()));
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaRandom, LOCKSTEP_TEST_DEVICES);

class CudaDropout : public testing::DeviceTest {};

template <typename T>
void expect_dropout_exact(Device device) {
  struct Case {
    Shape shape;
    double p;
    int64_t first_sample;
  };
  // Odd sample sizes (a partial Philox block at each sample's end), one element per sample,
  // global sample indices near 2^32, an empty batch.
  const std::vector<Case> cases = {{{5, 1037}, 0.1, 0},
                                   {{5, 1037}, 0.5, 123},
                                   {{3, 2, 7}, 0.9, (int64_t{1} << 32) - 3},
                                   {{64, 1}, 0.3, 77},
                                   {{0, 4}, 0.5, 0}};
  uint64_t seed = 500;
  for (const Case& c : cases) {
    SCOPED_TRACE(shape_str(c.shape) + " p " + std::to_string(c.p) + " first sample " + std::to_string(c.first_sample) +
                 " " + dtype_name(dtype_of<T>()));
    const DropoutKey key{seed, dropout_stream(2, seed), c.first_sample};
    const Tensor x = random_f64(c.shape, seed++).to(dtype_of<T>());
    const Tensor g = random_f64(c.shape, seed++).to(dtype_of<T>());
    const auto vx = x.to_vector<T>(), vg = g.to_vector<T>();
    Tensor xd = x.to(device).detach();
    xd.set_requires_grad(true);
    const Tensor out = dropout(xd, c.p, true, key);
    ASSERT_EQ(out.device(), device);
    out.backward(g.to(device));
    const auto got = out.to_vector<T>();
    const auto grad = xd.grad().to_vector<T>();
    const int64_t samples = c.shape[0];
    const int64_t per_sample = samples > 0 ? x.numel() / samples : 0;
    const T scale = static_cast<T>(1.0 / (1.0 - c.p));
    std::vector<T> expected_out, expected_grad;
    int64_t kept_count = 0;
    for (int64_t s = 0; s < samples; ++s)
      for (int64_t j = 0; j < per_sample; ++j) {
        const uint64_t counter = (static_cast<uint64_t>(c.first_sample + s) << 32) | static_cast<uint64_t>(j / 4);
        const auto words = philox4x32(key.seed, key.stream, counter);
        const bool kept = uint_to_unit_float(words[static_cast<size_t>(j % 4)]) >= c.p;
        const auto i = static_cast<size_t>(s * per_sample + j);
        expected_out.push_back(kept ? vx[i] * scale : T(0));
        expected_grad.push_back(kept ? vg[i] * scale : T(0));
        kept_count += kept ? 1 : 0;
      }
    expect_same_bits(got, expected_out);
    expect_same_bits(grad, expected_grad);
    if (x.numel() >= 1000) {
      EXPECT_NEAR(static_cast<double>(kept_count) / static_cast<double>(x.numel()), 1 - c.p, 0.05);
    }
    // The same bits as the CPU's dropout (a check of the CPU itself on the cpu device).
    const Tensor on_cpu = dropout(x, c.p, true, key);
    expect_same_bits(got, on_cpu.to_vector<T>());
  }
}

TEST_P(CudaDropout, MasksAreTheCpusPhiloxBitsAndScaleTheGradient) {
  expect_dropout_exact<float>(GetParam());
  expect_dropout_exact<double>(GetParam());
}

TEST_P(CudaDropout, IdentityWhenNotTrainingAndStridedInputs) {
  const Device device = GetParam();
  const Tensor x = random_f64({6, 9}, 600).to(device);
  EXPECT_TRUE(dropout(x, 0.5, false, {}).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0, true, {}).is_same(x));
  // A transposed input is masked in its own (logical) element order.
  const DropoutKey key{1, dropout_stream(0, 1), 10};
  const Tensor view = transpose(x, 0, 1);  // [9, 6]: 9 samples of 6
  const auto got = dropout(view, 0.5, true, key).to_vector<double>();
  const auto dense = dropout(view.to(Device::cpu()).contiguous(), 0.5, true, key).to_vector<double>();
  expect_same_bits(got, dense);
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaDropout, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep
