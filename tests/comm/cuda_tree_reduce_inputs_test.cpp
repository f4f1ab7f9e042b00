// tree_reduce_inputs, the GPU fold of inputs that lie anywhere the GPU can read (single-process
// data parallelism folds the devices' sums with it): bit for bit the CPU's tree_reduce, for
// every dtype and op, over 1 to 64 inputs, into one of them, and from another device's memory
// where the GPUs can reach each other. Skipped without a GPU; scripts/gpu-check runs it.
#include <gtest/gtest.h>

#if LOCKSTEP_HAVE_CUDA

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "lockstep/comm/cuda/tree_reduce_kernel.h"
#include "lockstep/comm/tree_reduce.h"
#include "lockstep/core/cuda/peer_access.h"
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/core/tensor.h"
#include "testing/devices.h"

namespace lockstep::comm {
namespace {

const Device kCuda0(DeviceType::cuda, 0);
const Device kCuda1(DeviceType::cuda, 1);

using Bytes = std::vector<char>;

// Values over many binades and both signs (another summation order gives other bits);
// integers over their whole range (sums wrap); for f32, NaN, infinities and both zeros
// among them, where max/min and their operands' order matter.
Bytes irregular(DType dtype, int64_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), 0.0f, -0.0f};
  const size_t size = dtype_size(dtype);
  Bytes bytes(static_cast<size_t>(count) * size);
  for (int64_t i = 0; i < count; ++i) {
    float value = std::ldexp(mantissa(gen), exponent(gen));
    if (dtype == DType::f32 && gen() % 16 == 0) value = specials[gen() % 5];
    char* at = bytes.data() + static_cast<size_t>(i) * size;
    const auto integer = static_cast<int64_t>((static_cast<uint64_t>(gen()) << 32) | gen());
    const double wide = static_cast<double>(value) * (1.0 + 1e-9 * static_cast<double>(gen() % 1000));
    const uint16_t bf16 = f32_to_bf16(value), f16 = f32_to_f16(value);
    const auto narrow = static_cast<int32_t>(integer);
    switch (dtype) {
      case DType::f32:
        std::memcpy(at, &value, 4);
        break;
      case DType::f64:
        std::memcpy(at, &wide, 8);
        break;
      case DType::bf16:
        std::memcpy(at, &bf16, 2);
        break;
      case DType::f16:
        std::memcpy(at, &f16, 2);
        break;
      case DType::i32:
        std::memcpy(at, &narrow, 4);
        break;
      case DType::i64:
        std::memcpy(at, &integer, 8);
        break;
      case DType::u8:
        *at = static_cast<char>(integer);
        break;
    }
  }
  return bytes;
}

Tensor upload(const Bytes& bytes, DType dtype, Device device) {
  const Tensor host = Tensor::empty({static_cast<int64_t>(bytes.size() / dtype_size(dtype))}, dtype);
  std::memcpy(host.raw_data(), bytes.data(), bytes.size());
  return host.to(device);
}

Bytes download(const Tensor& t) {
  const Tensor host = t.to(Device::cpu());
  Bytes bytes(host.nbytes());
  std::memcpy(bytes.data(), host.raw_data(), bytes.size());
  return bytes;
}

Bytes cpu_fold(const std::vector<Bytes>& inputs, int64_t count, DType dtype, ReduceOp op) {
  std::vector<const void*> pointers;
  for (const Bytes& b : inputs) pointers.push_back(b.data());
  Bytes out(static_cast<size_t>(count) * dtype_size(dtype));
  tree_reduce(pointers.data(), static_cast<int>(inputs.size()), out.data(), count, dtype, op);
  return out;
}

// The first element where two byte buffers of dtype differ, or -1.
int64_t first_difference(const Bytes& a, const Bytes& b, DType dtype) {
  if (a.size() != b.size()) return 0;
  const size_t size = dtype_size(dtype);
  for (size_t i = 0; i < a.size(); i += size)
    if (std::memcmp(a.data() + i, b.data() + i, size) != 0) return static_cast<int64_t>(i / size);
  return -1;
}

// The GPU fold on `device` of inputs uploaded to devices[k % devices.size()], one tensor each.
Bytes gpu_fold(const std::vector<Bytes>& inputs, int64_t count, DType dtype, ReduceOp op, Device device,
               const std::vector<Device>& places) {
  std::vector<Tensor> tensors;
  std::vector<const void*> pointers;
  for (size_t k = 0; k < inputs.size(); ++k) {
    tensors.push_back(upload(inputs[k], dtype, places[k % places.size()]));
    pointers.push_back(tensors.back().data_ptr());
  }
  for (const Device place : places)
    lockstep::cuda::synchronize(place);  // the uploads ran on their own devices' streams
  const Tensor out = Tensor::empty({count}, dtype, device);
  {
    const lockstep::cuda::OnDevice on(device);
    cuda::tree_reduce_inputs(pointers.data(), static_cast<int>(pointers.size()), out.data_ptr(), count, dtype, op,
                             on.stream());
  }
  return download(out);
}

std::vector<ReduceOp> ops_for(DType dtype) {
  if (is_floating(dtype)) return {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::rounded_sum};
  return {ReduceOp::sum, ReduceOp::max, ReduceOp::min};
}

TEST(CudaTreeReduceInputs, MatchesTheCpusTreeReduceBitForBit) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda0);
  const int64_t count = 1031;  // several blocks, a ragged last one
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    for (const ReduceOp op : ops_for(dtype)) {
      for (const int n : {1, 2, 3, 4, 5, 6, 7, 8, 13, cuda::kMaxTreeReduceInputs}) {
        std::vector<Bytes> inputs;
        for (int k = 0; k < n; ++k) inputs.push_back(irregular(dtype, count, static_cast<uint32_t>(100 * n + k)));
        EXPECT_EQ(first_difference(gpu_fold(inputs, count, dtype, op, kCuda0, {kCuda0}),
                                   cpu_fold(inputs, count, dtype, op), dtype),
                  -1)
            << dtype_name(dtype) << " " << reduce_op_name(op) << " over " << n << " inputs";
      }
    }
  }
}

TEST(CudaTreeReduceInputs, MayWriteIntoAnInput) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda0);
  const int64_t count = 777;
  std::vector<Bytes> inputs;
  std::vector<Tensor> tensors;
  std::vector<const void*> pointers;
  for (uint32_t k = 0; k < 5; ++k) {
    inputs.push_back(irregular(DType::f32, count, 7 + k));
    tensors.push_back(upload(inputs.back(), DType::f32, kCuda0));
    pointers.push_back(tensors.back().data_ptr());
  }
  {
    const lockstep::cuda::OnDevice on(kCuda0);
    cuda::tree_reduce_inputs(pointers.data(), 5, tensors[3].data_ptr(), count, DType::f32, ReduceOp::sum, on.stream());
  }
  EXPECT_EQ(first_difference(download(tensors[3]), cpu_fold(inputs, count, DType::f32, ReduceOp::sum), DType::f32), -1);
}

TEST(CudaTreeReduceInputs, ReadsAnotherDevicesMemoryWhereItsGpuCan) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda1, 2);
  if (!lockstep::cuda::can_read_peer_memory(lockstep::cuda::physical_device(kCuda1),
                                            lockstep::cuda::physical_device(kCuda0)))
    GTEST_SKIP() << "cuda:1's GPU cannot read cuda:0's memory (no peer access between them)";
  const int64_t count = 4099;
  std::vector<Bytes> inputs;
  for (uint32_t k = 0; k < 6; ++k) inputs.push_back(irregular(DType::f32, count, 50 + k));
  EXPECT_EQ(first_difference(gpu_fold(inputs, count, DType::f32, ReduceOp::sum, kCuda1, {kCuda0, kCuda1}),
                             cpu_fold(inputs, count, DType::f32, ReduceOp::sum), DType::f32),
            -1);
}

TEST(CudaTreeReduceInputs, MoreInputsThanOneLaunchTakesAreAnError) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda0);
  const Tensor out = Tensor::empty({4}, DType::f32, kCuda0);
  const std::vector<const void*> pointers(cuda::kMaxTreeReduceInputs + 1, out.data_ptr());
  const lockstep::cuda::OnDevice on(kCuda0);
  try {
    cuda::tree_reduce_inputs(pointers.data(), cuda::kMaxTreeReduceInputs + 1, out.data_ptr(), 4, DType::f32,
                             ReduceOp::sum, on.stream());
    FAIL() << "65 inputs were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 to 64 inputs in one launch, got 65"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::comm

#endif
