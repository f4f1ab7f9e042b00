// The nccl backend. Without a CUDA device every test skips (the compile-only machines);
// with one GPU the tree-order kernel and world-of-one calls run; with two or more, ranks
// run as threads of this process, rank r on cuda:r (NCCL refuses two ranks of one
// communicator on one GPU). Deterministic results are compared bit for bit with the CPU's
// tree_reduce on the same inputs, and the kernel's order also with sums worked out by hand.
#include <gtest/gtest.h>

#if LOCKSTEP_HAVE_NCCL

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/comm/cuda/nccl_communicator.h"
#include "lockstep/comm/cuda/nccl_support.h"
#include "lockstep/comm/cuda/tree_reduce_kernel.h"
#include "lockstep/comm/store.h"
#include "lockstep/comm/tree_reduce.h"
#include "lockstep/core/cuda_device.h"
#include "lockstep/core/storage.h"
#include "lockstep/core/tensor.h"

namespace lockstep::comm {
namespace {

using Bytes = std::vector<char>;

int cuda_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

// Skips the test unless this host has at least k CUDA devices.
#define REQUIRE_CUDA_DEVICES(k)                                                                               \
  do {                                                                                                        \
    const int available = cuda_devices();                                                                     \
    if (available == 0 && ::lockstep::cuda::cuda_required())                                                  \
      FAIL() << "no CUDA device: " << ::lockstep::cuda::unavailable_reason();                                 \
    if (available == 0) GTEST_SKIP() << "no CUDA device: " << ::lockstep::cuda::unavailable_reason();         \
    if (available < (k))                                                                                      \
      GTEST_SKIP() << "needs " << (k) << " CUDA devices (NCCL allows one rank per GPU), found " << available; \
  } while (0)

void expect_cuda(cudaError_t rc, const char* what) {
  ASSERT_EQ(rc, cudaSuccess) << what << ": " << cudaGetErrorString(rc);
}

// Device memory wrapped as a tensor on cuda:device (core has no CUDA allocator yet).
Tensor cuda_empty(const Shape& shape, DType dtype, int device) {
  const size_t bytes = static_cast<size_t>(numel(shape)) * dtype_size(dtype);
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  void* data = nullptr;
  expect_cuda(cudaMalloc(&data, std::max<size_t>(bytes, 1)), "cudaMalloc");
  cudaSetDevice(previous);
  auto storage = std::make_shared<Storage>(Device(DeviceType::cuda, device), bytes, data, [](void* p) { cudaFree(p); });
  return Tensor::from_storage(std::move(storage), shape, dtype);
}

void* device_data(const Tensor& t) {
  return static_cast<char*>(t.storage()->data()) + t.offset() * static_cast<int64_t>(dtype_size(t.dtype()));
}

Tensor upload(const Bytes& bytes, DType dtype, int device) {
  const auto count = static_cast<int64_t>(bytes.size() / dtype_size(dtype));
  Tensor t = cuda_empty({count}, dtype, device);
  expect_cuda(cudaMemcpy(device_data(t), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "upload");
  return t;
}

Bytes download(const Tensor& t) {
  Bytes bytes(t.nbytes());
  expect_cuda(cudaMemcpy(bytes.data(), device_data(t), bytes.size(), cudaMemcpyDeviceToHost), "download");
  return bytes;
}

// Irregular values of dtype: magnitudes over many binades and both signs, so that any other
// summation order gives other bits; integers over their whole range, so that sums wrap.
Bytes irregular(DType dtype, int64_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  Bytes bytes(static_cast<size_t>(count) * dtype_size(dtype));
  for (int64_t i = 0; i < count; ++i) {
    const float value = std::ldexp(mantissa(gen), exponent(gen));
    char* at = bytes.data() + static_cast<size_t>(i) * dtype_size(dtype);
    switch (dtype) {
      case DType::f32:
        std::memcpy(at, &value, 4);
        break;
      case DType::f64: {
        const double wide = static_cast<double>(value) * (1.0 + 1e-9 * static_cast<double>(gen() % 1000));
        std::memcpy(at, &wide, 8);
        break;
      }
      case DType::bf16: {
        const uint16_t bits = f32_to_bf16(value);
        std::memcpy(at, &bits, 2);
        break;
      }
      case DType::f16: {
        const uint16_t bits = f32_to_f16(value);
        std::memcpy(at, &bits, 2);
        break;
      }
      case DType::i32: {
        const auto v = static_cast<int32_t>(gen());
        std::memcpy(at, &v, 4);
        break;
      }
      case DType::i64: {
        const auto v = static_cast<int64_t>((static_cast<uint64_t>(gen()) << 32) | gen());
        std::memcpy(at, &v, 8);
        break;
      }
      case DType::u8:
        *at = static_cast<char>(gen());
        break;
    }
  }
  return bytes;
}

// Plants NaN, infinities and both zeros among f32 values, where max/min and the order of
// their operands matter.
void plant_specials(Bytes& bytes, uint32_t seed) {
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), 0.0f, -0.0f};
  std::mt19937 gen(seed);
  const size_t count = bytes.size() / 4;
  for (size_t k = 0; k < count / 16; ++k) {
    const float value = specials[gen() % 5];
    std::memcpy(bytes.data() + (gen() % count) * 4, &value, 4);
  }
}

Bytes cpu_tree_reduce(const std::vector<Bytes>& inputs, int64_t count, DType dtype, ReduceOp op) {
  std::vector<const void*> pointers;
  for (const Bytes& b : inputs) pointers.push_back(b.data());
  Bytes out(static_cast<size_t>(count) * dtype_size(dtype));
  tree_reduce(pointers.data(), static_cast<int>(inputs.size()), out.data(), count, dtype, op);
  return out;
}

// The first element where two byte buffers of dtype differ, or -1.
int64_t first_difference(const Bytes& a, const Bytes& b, DType dtype) {
  if (a.size() != b.size()) return 0;
  const size_t es = dtype_size(dtype);
  for (size_t i = 0; i < a.size(); i += es) {
    if (std::memcmp(a.data() + i, b.data() + i, es) != 0) return static_cast<int64_t>(i / es);
  }
  return -1;
}

std::vector<ReduceOp> ops_for(DType dtype) {
  if (is_floating(dtype)) return {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
  return {ReduceOp::sum, ReduceOp::max, ReduceOp::min};
}

// ---- the fold kernel alone (one GPU, no NCCL) ----

// Runs the kernel over n rows of count elements, row_stride apart, into a separate output.
Bytes gpu_fold(const std::vector<Bytes>& rows, int64_t count, int64_t row_stride, DType dtype, ReduceOp op) {
  const size_t es = dtype_size(dtype);
  Bytes packed(rows.size() * static_cast<size_t>(row_stride) * es, 0);
  for (size_t k = 0; k < rows.size(); ++k) {
    std::memcpy(packed.data() + k * static_cast<size_t>(row_stride) * es, rows[k].data(), rows[k].size());
  }
  Tensor device_rows = upload(packed, dtype, 0);
  Tensor device_out = cuda_empty({count}, dtype, 0);
  cuda::tree_reduce_rows(device_data(device_rows), row_stride, static_cast<int>(rows.size()), device_data(device_out),
                         count, dtype, op, nullptr);
  expect_cuda(cudaDeviceSynchronize(), "the fold kernel");
  return download(device_out);
}

TEST(NcclCommunicator, TreeReduceKernelMatchesCpuTreeReduceBitForBit) {
  REQUIRE_CUDA_DEVICES(1);
  const int64_t count = 1031;  // several blocks, ragged last one
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i32, DType::i64}) {
    std::vector<ReduceOp> ops = ops_for(dtype);
    ops.push_back(ReduceOp::rounded_sum);  // the kernel has it; NCCL's own mode does not
    for (ReduceOp op : ops) {
      for (int n = 1; n <= 8; ++n) {
        std::vector<Bytes> rows;
        for (int k = 0; k < n; ++k) {
          rows.push_back(irregular(dtype, count, static_cast<uint32_t>(1000 * n + k)));
          if (dtype == DType::f32 && op != ReduceOp::sum) plant_specials(rows.back(), static_cast<uint32_t>(k));
        }
        const Bytes expected = cpu_tree_reduce(rows, count, dtype, op);
        const Bytes got = gpu_fold(rows, count, count + 3, dtype, op);
        EXPECT_EQ(first_difference(got, expected, dtype), -1)
            << dtype_name(dtype) << " " << reduce_op_name(op) << " over " << n << " rows";
      }
    }
  }
}

// NCCL's own mode takes avg as its sum divided afterwards: the division kernel gives what
// the CPU gives, the quotient in f32 rounded once for bf16 and f16.
TEST(NcclCommunicator, DivisionKernelMatchesTheCpusQuotient) {
  REQUIRE_CUDA_DEVICES(1);
  const int64_t count = 1031;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (int divisor : {3, 6, 7}) {
      const Bytes values = irregular(dtype, count, static_cast<uint32_t>(divisor));
      std::vector<double> wide(static_cast<size_t>(count));
      Bytes expected(values.size());
      if (dtype == DType::f64) {
        convert_elements(values.data(), dtype, wide.data(), DType::f64, count);
        for (double& v : wide) v /= divisor;
        convert_elements(wide.data(), DType::f64, expected.data(), dtype, count);
      } else {
        std::vector<float> narrow(static_cast<size_t>(count));
        convert_elements(values.data(), dtype, narrow.data(), DType::f32, count);
        for (float& v : narrow) v /= static_cast<float>(divisor);
        convert_elements(narrow.data(), DType::f32, expected.data(), dtype, count);
      }
      Tensor device = upload(values, dtype, 0);
      cuda::divide_elements(device_data(device), count, dtype, divisor, nullptr);
      expect_cuda(cudaDeviceSynchronize(), "the division kernel");
      EXPECT_EQ(first_difference(download(device), expected, dtype), -1) << dtype_name(dtype) << " / " << divisor;
    }
  }
}

TEST(NcclCommunicator, TreeReduceKernelFoldsInTreeOrder) {
  REQUIRE_CUDA_DEVICES(1);
  // Three leaves fold as (x0 + x1) + x2: 1e8 - 1e8 + 1 = 1, where x0 + (x1 + x2) gives 0 in f32.
  // Five fold as ((x0 + x1) + (x2 + x3)) + x4, written out here in double-checked f32 steps.
  const std::vector<float> three = {1e8f, -1e8f, 1.0f};
  const std::vector<float> five = {1.0f, 1e8f, -1e8f, 3.0f, 0.25f};
  auto rows_of = [](const std::vector<float>& values) {
    std::vector<Bytes> rows;
    for (float v : values) {
      Bytes b(4);
      std::memcpy(b.data(), &v, 4);
      rows.push_back(b);
    }
    return rows;
  };
  auto as_float = [](const Bytes& b) {
    float v = 0;
    std::memcpy(&v, b.data(), 4);
    return v;
  };
  EXPECT_EQ(as_float(gpu_fold(rows_of(three), 1, 1, DType::f32, ReduceOp::sum)), 1.0f);
  const float left = (1.0f + 1e8f) + (-1e8f + 3.0f);
  EXPECT_EQ(as_float(gpu_fold(rows_of(five), 1, 1, DType::f32, ReduceOp::sum)), left + 0.25f);
  EXPECT_EQ(as_float(gpu_fold(rows_of(five), 1, 1, DType::f32, ReduceOp::avg)), (left + 0.25f) / 5.0f);
}

TEST(NcclCommunicator, TreeReduceKernelMayWriteIntoARow) {
  REQUIRE_CUDA_DEVICES(1);
  const int n = 37;  // a deep, lopsided tree
  const int64_t count = 300;
  std::vector<Bytes> rows;
  for (int k = 0; k < n; ++k) rows.push_back(irregular(DType::bf16, count, static_cast<uint32_t>(77 + k)));
  const Bytes expected = cpu_tree_reduce(rows, count, DType::bf16, ReduceOp::sum);
  Bytes packed;
  for (const Bytes& r : rows) packed.insert(packed.end(), r.begin(), r.end());
  Tensor device_rows = upload(packed, DType::bf16, 0);
  char* row5 = static_cast<char*>(device_data(device_rows)) + 5 * count * 2;
  cuda::tree_reduce_rows(device_data(device_rows), count, n, row5, count, DType::bf16, ReduceOp::sum, nullptr);
  expect_cuda(cudaDeviceSynchronize(), "the fold kernel");
  const Bytes all = download(device_rows);
  const Bytes got(all.begin() + 5 * count * 2, all.begin() + 6 * count * 2);
  EXPECT_EQ(first_difference(got, expected, DType::bf16), -1);
}

// ---- communicators ----

// Runs body(comm) on one thread per rank, rank r on cuda:r, meeting at one MemoryStore.
// Each rank's exception, if any, fails the test naming the rank.
template <typename Body>
void run_ranks(int size, bool deterministic, Body body,
               std::chrono::milliseconds timeout = std::chrono::milliseconds(60000)) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = NcclCommunicator::create(store, "test", r, size, r, timeout, deterministic);
        body(*comm);
      } catch (const std::exception& error) {
        errors[static_cast<size_t>(r)] = error.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

int world_size() { return std::min(cuda_devices(), 4); }

TEST(NcclCommunicator, WorldOfOneRunsEveryCollective) {
  REQUIRE_CUDA_DEVICES(1);
  for (bool deterministic : {false, true}) {
    run_ranks(1, deterministic, [deterministic](NcclCommunicator& comm) {
      EXPECT_STREQ(comm.backend(), "nccl");
      EXPECT_EQ(comm.deterministic(), deterministic);
      for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
        const Bytes values = irregular(dtype, 1000, 5);
        for (ReduceOp op : ops_for(dtype)) {
          Tensor t = upload(values, dtype, 0);
          comm.all_reduce(t, op);
          // The fold of one leaf is the leaf (avg divides by 1).
          EXPECT_EQ(first_difference(download(t), values, dtype), -1) << dtype_name(dtype) << " " << reduce_op_name(op);
        }
      }
      const Bytes values = irregular(DType::f32, 64, 9);
      Tensor in = upload(values, DType::f32, 0);
      Tensor out = cuda_empty({64}, DType::f32, 0);
      comm.reduce_scatter(in, out);
      EXPECT_EQ(first_difference(download(out), values, DType::f32), -1);
      Tensor gathered = cuda_empty({64}, DType::f32, 0);
      comm.all_gather(in, gathered);
      EXPECT_EQ(first_difference(download(gathered), values, DType::f32), -1);
      comm.broadcast(in, 0);
      comm.barrier();
      std::shared_ptr<Communicator> child = comm.split(3, 0);
      ASSERT_NE(child, nullptr);
      EXPECT_EQ(child->size(), 1);
      Tensor again = upload(values, DType::f32, 0);
      child->all_reduce(again);
      EXPECT_EQ(first_difference(download(again), values, DType::f32), -1);
      EXPECT_EQ(comm.split(-1, 0), nullptr);
    });
  }
}

// NCCL takes whole GPUs: with logical devices (LOCKSTEP_CUDA_DEVICES_PER_GPU, as gpu-check's
// CUDA tests run) a communicator is refused by name; with whole GPUs it is made.
TEST(NcclCommunicator, RefusesCudaLogicalDevicesByName) {
  REQUIRE_CUDA_DEVICES(1);
  if (::lockstep::cuda::devices_per_gpu() == 1) {
    run_ranks(1, true, [](NcclCommunicator& comm) { EXPECT_EQ(comm.size(), 1); });
    return;
  }
  try {
    NcclCommunicator::create(std::make_shared<MemoryStore>(), "logical", 0, 1, 0, std::chrono::seconds(10), true);
    ADD_FAILURE() << "a communicator was made over logical devices";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what())
                  .find("LOCKSTEP_CUDA_DEVICES_PER_GPU=" + std::to_string(::lockstep::cuda::devices_per_gpu()) +
                        " splits each GPU into logical devices"),
              std::string::npos)
        << error.what();
  }
}

// A host tensor (a step's flag, its loss, a checkpoint's pieces) travels through the rank's
// GPU and back, so a layout never asks which backend it has.
TEST(NcclCommunicator, HostTensorsTravelThroughTheRanksGpu) {
  REQUIRE_CUDA_DEVICES(1);
  const int n = world_size();
  run_ranks(n, true, [n](NcclCommunicator& comm) {
    EXPECT_EQ(comm.memory(), Device(DeviceType::cuda, comm.rank()));
    const double mine = comm.rank() + 1.5;
    const Tensor loss = Tensor::from_vector(std::vector<double>{mine, -mine}, {2});
    comm.all_reduce(loss);
    EXPECT_EQ(loss.device(), Device::cpu());
    EXPECT_EQ(loss.to_vector<double>(), (std::vector<double>{n * (n + 2) / 2.0, -n * (n + 2) / 2.0}));
    const Tensor flag = Tensor::from_vector(std::vector<int64_t>{comm.rank() == n - 1 ? 7 : 0}, {1});
    comm.all_reduce(flag, ReduceOp::max);
    EXPECT_EQ(flag.to_vector<int64_t>(), std::vector<int64_t>{7});
    const Tensor root = Tensor::full({3}, comm.rank() == 0 ? 2.5 : -1.0);
    comm.broadcast(root, 0);
    EXPECT_EQ(root.to_vector<float>(), (std::vector<float>{2.5f, 2.5f, 2.5f}));
    const Tensor gathered = Tensor::empty({n});
    comm.all_gather(Tensor::full({1}, static_cast<double>(comm.rank())), gathered);
    for (int r = 0; r < n; ++r) EXPECT_EQ(gathered.to_vector<float>()[static_cast<size_t>(r)], r);
    if (n >= 2 && comm.rank() < 2) {  // a message from host memory to host memory
      const Tensor message = Tensor::full({5}, comm.rank() == 0 ? 4.0 : 0.0, DType::f64);
      if (comm.rank() == 0) comm.send(message, 1, 3);
      if (comm.rank() == 1) comm.recv(message, 0, 3);
      EXPECT_EQ(message.to_vector<double>(), std::vector<double>(5, 4.0)) << "rank " << comm.rank();
    }
  });
}

TEST(NcclCommunicator, TensorOnAnotherGpuIsNamed) {
  REQUIRE_CUDA_DEVICES(2);
  run_ranks(2, false, [](NcclCommunicator& comm) {
    Tensor elsewhere = cuda_empty({8}, DType::f32, 1 - comm.rank());
    try {
      comm.all_reduce(elsewhere);
      ADD_FAILURE() << "a tensor on another GPU was accepted";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("passed a tensor on cuda:1 but its communicator is on cuda:0"), std::string::npos)
          << message;
    }
  });
}

TEST(NcclCommunicator, AllReduceMatchesTreeReduceInBothModes) {
  REQUIRE_CUDA_DEVICES(2);
  const int n = world_size();
  for (bool deterministic : {false, true}) {
    run_ranks(n, deterministic, [&](NcclCommunicator& comm) {
      for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::i32}) {
        for (ReduceOp op : ops_for(dtype)) {
          for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4099}}) {
            std::vector<Bytes> inputs;
            for (int r = 0; r < n; ++r) inputs.push_back(irregular(dtype, count, static_cast<uint32_t>(31 * r + 7)));
            Tensor t = upload(inputs[static_cast<size_t>(comm.rank())], dtype, comm.rank());
            comm.all_reduce(t, op);
            const Bytes got = download(t);
            const Bytes expected = cpu_tree_reduce(inputs, count, dtype, op);
            const bool order_free = op == ReduceOp::max || op == ReduceOp::min || dtype == DType::i32;
            if (deterministic || order_free) {
              EXPECT_EQ(first_difference(got, expected, dtype), -1)
                  << dtype_name(dtype) << " " << reduce_op_name(op) << " count " << count;
            } else if (dtype == DType::f32) {
              // NCCL's own order: equal up to rounding, which scales with the sum of magnitudes.
              for (int64_t i = 0; i < count; ++i) {
                double magnitude = 0;
                for (const Bytes& input : inputs) {
                  float x = 0;
                  std::memcpy(&x, input.data() + 4 * i, 4);
                  magnitude += std::fabs(x);
                }
                float a = 0;
                float b = 0;
                std::memcpy(&a, got.data() + 4 * i, 4);
                std::memcpy(&b, expected.data() + 4 * i, 4);
                ASSERT_NEAR(a, b, 1e-6 * magnitude) << reduce_op_name(op) << " element " << i;
              }
            }
          }
        }
      }
    });
  }
}

TEST(NcclCommunicator, ReduceScatterMatchesTreeReduceInDeterministicMode) {
  REQUIRE_CUDA_DEVICES(2);
  const int n = world_size();
  run_ranks(n, true, [&](NcclCommunicator& comm) {
    const int64_t count = 513;
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        std::vector<Bytes> inputs;
        for (int r = 0; r < n; ++r) inputs.push_back(irregular(dtype, count * n, static_cast<uint32_t>(11 + r)));
        Tensor in = upload(inputs[static_cast<size_t>(comm.rank())], dtype, comm.rank());
        Tensor out = cuda_empty({count}, dtype, comm.rank());
        comm.reduce_scatter(in, out, op);
        const Bytes all = cpu_tree_reduce(inputs, count * n, dtype, op);
        const size_t slice = static_cast<size_t>(count) * dtype_size(dtype);
        const Bytes expected(all.begin() + static_cast<std::ptrdiff_t>(slice * comm.rank()),
                             all.begin() + static_cast<std::ptrdiff_t>(slice * (comm.rank() + 1)));
        EXPECT_EQ(first_difference(download(out), expected, dtype), -1)
            << dtype_name(dtype) << " " << reduce_op_name(op);
      }
    }
  });
}

TEST(NcclCommunicator, AllGatherBroadcastAndBarrier) {
  REQUIRE_CUDA_DEVICES(2);
  const int n = world_size();
  run_ranks(n, false, [&](NcclCommunicator& comm) {
    const int64_t count = 300;
    Bytes expected;
    for (int r = 0; r < n; ++r) {
      const Bytes part = irregular(DType::f32, count, static_cast<uint32_t>(500 + r));
      expected.insert(expected.end(), part.begin(), part.end());
    }
    const size_t slice = static_cast<size_t>(count) * 4;
    Tensor in = upload(Bytes(expected.begin() + static_cast<std::ptrdiff_t>(slice * comm.rank()),
                             expected.begin() + static_cast<std::ptrdiff_t>(slice * (comm.rank() + 1))),
                       DType::f32, comm.rank());
    Tensor out = cuda_empty({count * n}, DType::f32, comm.rank());
    comm.all_gather(in, out);
    EXPECT_EQ(first_difference(download(out), expected, DType::f32), -1);

    const Bytes root_values = irregular(DType::u8, 77, 1234);
    Tensor b = upload(comm.rank() == n - 1 ? root_values : Bytes(77, 0), DType::u8, comm.rank());
    comm.broadcast(b, n - 1);
    EXPECT_EQ(download(b), root_values);
    comm.barrier();
  });
}

TEST(NcclCommunicator, SendRecvAroundARingInOrder) {
  REQUIRE_CUDA_DEVICES(2);
  const int n = world_size();
  run_ranks(n, false, [&](NcclCommunicator& comm) {
    const int next = (comm.rank() + 1) % n;
    const int previous = (comm.rank() + n - 1) % n;
    std::vector<Tensor> sent;
    std::vector<Work> sends;
    for (int tag = 0; tag < 3; ++tag) {
      sent.push_back(upload(irregular(DType::f32, 1000 * (tag + 1), static_cast<uint32_t>(comm.rank() * 10 + tag)),
                            DType::f32, comm.rank()));
      sends.push_back(comm.send_async(sent.back(), next, tag));
    }
    // A collective runs meanwhile on its own lane.
    Tensor zeros = upload(Bytes(4 * 16, 0), DType::f32, comm.rank());
    comm.all_reduce(zeros);
    for (int tag = 0; tag < 3; ++tag) {
      Tensor got = cuda_empty({1000 * (tag + 1)}, DType::f32, comm.rank());
      comm.recv(got, previous, tag);
      EXPECT_EQ(download(got), irregular(DType::f32, 1000 * (tag + 1), static_cast<uint32_t>(previous * 10 + tag)))
          << "tag " << tag;
    }
    for (Work& w : sends) w.wait();
  });
}

TEST(NcclCommunicator, RecvOfTheWrongSizeIsNamedAndTheSenderFinishes) {
  REQUIRE_CUDA_DEVICES(2);
  run_ranks(2, false, [](NcclCommunicator& comm) {
    if (comm.rank() == 0) {
      comm.send(upload(irregular(DType::f32, 5, 1), DType::f32, 0), 1, 4);
      return;
    }
    Tensor wrong = cuda_empty({6}, DType::f32, 1);
    try {
      comm.recv(wrong, 0, 4);
      ADD_FAILURE() << "a 5-element message filled a 6-element tensor";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("sent tag 4, 5 f32"), std::string::npos) << error.what();
    }
  });
}

TEST(NcclCommunicator, MismatchIsNamedOnEveryRank) {
  REQUIRE_CUDA_DEVICES(2);
  const int n = world_size();
  run_ranks(n, false, [](NcclCommunicator& comm) {
    Tensor t = cuda_empty({comm.rank() == 1 ? 11 : 10}, DType::f32, comm.rank());
    try {
      comm.all_reduce(t);
      ADD_FAILURE() << "rank " << comm.rank() << " accepted a mismatched all_reduce";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("rank 0 called all_reduce #1 (10 f32, sum)"), std::string::npos) << message;
      EXPECT_NE(message.find("rank 1 called all_reduce #1 (11 f32, sum)"), std::string::npos) << message;
    }
    Tensor later = cuda_empty({10}, DType::f32, comm.rank());
    EXPECT_THROW(comm.all_reduce(later), CommError);
  });
}

TEST(NcclCommunicator, DeadRankTimesOutNamingTheCollective) {
  REQUIRE_CUDA_DEVICES(2);
  std::atomic<bool> done{false};
  run_ranks(2, false, [&](NcclCommunicator& comm) {
    if (comm.rank() == 1) {  // alive but never calls: as good as dead to rank 0
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    comm.set_timeout(std::chrono::milliseconds(1500));
    Tensor t = cuda_empty({100}, DType::f32, 0);
    try {
      comm.all_reduce(t);
      ADD_FAILURE() << "all_reduce returned without rank 1";
    } catch (const CommError& error) {
      // Where it stalls (joining the call-description exchange, or waiting for it) is NCCL's
      // business; the message names the call, the rank and the limit.
      const std::string message = error.what();
      EXPECT_NE(message.find("all_reduce #1 (100 f32, sum) on rank 0"), std::string::npos) << message;
      EXPECT_NE(message.find("did not complete within 1.5 s"), std::string::npos) << message;
    }
    done = true;
  });
}

TEST(NcclCommunicator, SplitRanksByKeyThenOldRank) {
  REQUIRE_CUDA_DEVICES(2);
  const int n = world_size();
  for (bool deterministic : {false, true}) {
    run_ranks(n, deterministic, [&](NcclCommunicator& comm) {
      const int color = comm.rank() % 2;
      std::shared_ptr<Communicator> child = comm.split(color, -comm.rank());  // reversed order
      ASSERT_NE(child, nullptr);
      std::vector<int> members;
      for (int r = 0; r < n; ++r) {
        if (r % 2 == color) members.push_back(r);
      }
      std::reverse(members.begin(), members.end());
      EXPECT_EQ(child->size(), static_cast<int>(members.size()));
      EXPECT_EQ(members[static_cast<size_t>(child->rank())], comm.rank());
      // Each child reduces its own members' ranks.
      const int32_t mine = comm.rank();
      Bytes bytes(4);
      std::memcpy(bytes.data(), &mine, 4);
      Tensor t = upload(bytes, DType::i32, comm.rank());
      child->all_reduce(t);
      int32_t sum = 0;
      std::memcpy(&sum, download(t).data(), 4);
      int32_t expected = 0;
      for (int r : members) expected += r;
      EXPECT_EQ(sum, expected);
    });
  }
}

// With ranks in one process NCCL has the peer GPU write into the buffers it is given (the
// deterministic mode's scratch rows among them): the backend's pool must be open to every
// other rank's GPU that can reach it, or the peer's kernel faults.
TEST(NcclCommunicator, BuffersAreOpenToThePeerGpusOfTheProcess) {
  REQUIRE_CUDA_DEVICES(2);
  const int n = world_size();
  run_ranks(n, true, [&](NcclCommunicator& comm) {
    const Bytes values = irregular(DType::f32, 100000, 3);
    Tensor t = upload(values, DType::f32, comm.cuda_device());
    comm.all_reduce(t);
    cudaMemPool_t pool = nccl::peer_visible_pool(comm.cuda_device());
    for (int peer = 0; peer < n; ++peer) {
      if (peer == comm.cuda_device()) continue;
      int can = 0;
      expect_cuda(cudaDeviceCanAccessPeer(&can, peer, comm.cuda_device()), "cudaDeviceCanAccessPeer");
      cudaMemLocation location{};
      location.type = cudaMemLocationTypeDevice;
      location.id = peer;
      cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
      expect_cuda(cudaMemPoolGetAccess(&flags, pool, &location), "cudaMemPoolGetAccess");
      EXPECT_EQ(flags, can ? cudaMemAccessFlagsProtReadWrite : cudaMemAccessFlagsProtNone)
          << "cuda:" << comm.cuda_device() << "'s pool seen from cuda:" << peer;
    }
  });
}

}  // namespace

// ---- the library's version (host calls only: these run without a GPU) ----

TEST(NcclVersion, CodesOfBothFormsReadAndCompare) {
  EXPECT_EQ(nccl::version_text(21803), "2.18.3");
  EXPECT_EQ(nccl::version_text(NCCL_VERSION(2, 14, 3)), "2.14.3");
  EXPECT_EQ(nccl::version_text(2708), "2.7.8");  // before 2.9: major·1000 + minor·100 + patch
  EXPECT_TRUE(nccl::version_at_least(21400, 21400));
  EXPECT_TRUE(nccl::version_at_least(22809, 21800));
  EXPECT_TRUE(nccl::version_at_least(30000, 21899));
  EXPECT_FALSE(nccl::version_at_least(21799, 21800));
  EXPECT_FALSE(nccl::version_at_least(2708, 21400));
  EXPECT_FALSE(nccl::version_at_least(21300, 21400));
}

TEST(NcclVersion, AnOlderLibraryIsAnErrorNamingBothVersionsAndTheFix) {
  EXPECT_EQ(nccl::runtime_version_problem(21805, 21800, 22809, "/opt/nccl/libnccl.so.2"), "");
  EXPECT_EQ(nccl::runtime_version_problem(22809, 21400, 22809, "/opt/nccl/libnccl.so.2"), "");
  const std::string problem = nccl::runtime_version_problem(21212, 21800, 22809, "/opt/nccl/libnccl.so.2");
  for (const char* part : {"2.12.12", "2.18.0", "2.28.9", "/opt/nccl/libnccl.so.2", "LD_LIBRARY_PATH", "NCCL_HOME"})
    EXPECT_NE(problem.find(part), std::string::npos) << part << " in: " << problem;
  EXPECT_NE(nccl::runtime_version_problem(2708, 21400, 21400, "libnccl.so.2").find("2.7.8"), std::string::npos);
}

TEST(NcclVersion, TheLoadedLibraryIsNewEnoughForThisBuild) {
  int runtime = 0;
  ASSERT_EQ(ncclGetVersion(&runtime), ncclSuccess);
  EXPECT_TRUE(nccl::version_at_least(runtime, nccl::kMinimumRuntimeVersion)) << nccl::version_text(runtime);
  EXPECT_NO_THROW(nccl::check_runtime_version());
  // A build against 2.18's headers or newer calls ncclCommSplit, so it needs 2.18 at run time.
  EXPECT_EQ(nccl::kMinimumRuntimeVersion,
            NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0) ? NCCL_VERSION(2, 18, 0) : NCCL_VERSION(2, 14, 0));
}

}  // namespace lockstep::comm

#else  // !LOCKSTEP_HAVE_NCCL

TEST(NcclCommunicator, NotBuilt) { GTEST_SKIP() << "this build has no nccl backend (nvcc or NCCL was not found)"; }

#endif
