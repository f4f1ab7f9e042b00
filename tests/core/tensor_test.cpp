#include "lockstep/core/tensor.h"

#include <gtest/gtest.h>

#include "lockstep/core/allocator.h"

namespace lockstep {
namespace {

TEST(Tensor, FactoriesAndMetadata) {
  const Tensor t = Tensor::full({2, 3}, 1.5);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.strides(), (Strides{3, 1}));
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_TRUE(t.is_contiguous());
  for (float v : t.to_vector<float>()) EXPECT_EQ(v, 1.5f);
  EXPECT_THROW(t.size(2), Error);
  EXPECT_THROW(Tensor::empty({2, -1}), Error);
}

TEST(Tensor, AsStridedViewsShareBytes) {
  const Tensor t = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  const Tensor column = t.as_strided({2}, {3}, 1);  // t[:, 1]
  EXPECT_EQ(column.to_vector<float>(), (std::vector<float>{1, 4}));
  EXPECT_FALSE(column.is_contiguous());
  t.data<float>()[4] = 40;
  EXPECT_EQ(column.to_vector<float>(), (std::vector<float>{1, 40}));
  EXPECT_THROW(t.as_strided({3}, {3}, 1), Error);  // reaches element 7 of 6
}

// set_data moves a tensor's elements into another buffer and keeps the tensor: every
// handle sees the new bytes, and what autograd keeps on it (here its grad) stays.
TEST(Tensor, SetDataMovesTheElementsAndKeepsTheTensor) {
  const Tensor param = Tensor::from_vector<float>({1, 2, 3}, {3});
  const Tensor handle = param;
  param.set_grad(Tensor::full({3}, 7.0));
  const Tensor flat = Tensor::from_vector<float>({9, 1, 2, 3}, {4});
  param.set_data(flat.as_strided({3}, {1}, 1));
  EXPECT_EQ(handle.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  flat.data<float>()[2] = 20;
  EXPECT_EQ(handle.to_vector<float>(), (std::vector<float>{1, 20, 3}));
  EXPECT_EQ(param.grad().to_vector<float>(), (std::vector<float>{7, 7, 7}));
  EXPECT_THROW(param.set_data(flat), Error);                            // 4 elements for 3
  EXPECT_THROW(param.set_data(Tensor::zeros({3}, DType::f64)), Error);  // another dtype
}

TEST(Tensor, CopyConvertsAcrossStridesAndDtypes) {
  const Tensor t = Tensor::from_vector<double>({0, 1, 2, 3, 4, 5}, {2, 3});
  const Tensor transposed = t.as_strided({3, 2}, {1, 3}, 0);
  const Tensor out = Tensor::empty({3, 2}, DType::bf16);
  out.copy_from(transposed);
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, TypedAccessChecksDtype) {
  const Tensor t = Tensor::zeros({2}, DType::i64);
  EXPECT_THROW(t.data<float>(), Error);
  EXPECT_NO_THROW(t.data<int64_t>());
}

TEST(MemoryStats, CountsAllocatedPeakAndReserved) {
  const Device device = Device::cpu(7);  // a device no other test uses
  const int64_t before = memory_stats(device).allocated_bytes;
  {
    const Tensor a = Tensor::empty({1024}, DType::f32, device);  // 4 KiB
    EXPECT_EQ(memory_stats(device).allocated_bytes - before, 4096);
    reset_peak_memory_stats(device);
    const Tensor b = Tensor::empty({2048}, DType::f32, device);
    EXPECT_EQ(memory_stats(device).peak_allocated_bytes - before, 4096 + 8192);
  }
  const MemoryStats after = memory_stats(device);
  EXPECT_EQ(after.allocated_bytes, before);
  EXPECT_EQ(after.peak_allocated_bytes - before, 4096 + 8192);
  EXPECT_GE(after.reserved_bytes, 4096 + 8192);  // freed blocks stay cached
  empty_cache(device);
  EXPECT_EQ(memory_stats(device).reserved_bytes, memory_stats(device).allocated_bytes);
}

TEST(Device, ParsesAndRejects) {
  EXPECT_EQ(Device::parse("cpu:3"), Device::cpu(3));
  EXPECT_EQ(Device::parse("cpu"), Device::cpu(0));
  EXPECT_TRUE(Device::parse("cuda:1").is_cuda());
  EXPECT_THROW(Device::parse("gpu:0"), Error);
  EXPECT_THROW(Device::parse("cpu:x"), Error);
  EXPECT_EQ(Device::cpu(2).str(), "cpu:2");
}

// An empty shape whose other sizes multiply past 64 bits is an error, not an overflow.
TEST(Tensor, AnEmptyShapeWithStridesPast64BitsIsRefused) {
  const int64_t big = int64_t{1} << 32;
  EXPECT_THROW(Tensor::empty({0, big, big}, DType::u8), Error);
  EXPECT_EQ(Tensor::empty({0, big}, DType::u8).numel(), 0);
}

}  // namespace
}  // namespace lockstep
