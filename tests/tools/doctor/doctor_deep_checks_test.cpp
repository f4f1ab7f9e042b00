// `lockstep doctor --deep`: the rules on results built by hand (an intact copy matrix, a pair
// returning zeros, a slow pair, a hang, a slow GPU, wrong products, one GPU, no GPU), and the
// probes' pieces run on CPU devices (the deadline worker, the byte comparison, a copy, a
// burn checked against the CPU reference).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>

#include "lockstep/core/cuda_device.h"
#include "lockstep/core/device.h"
#include "testing/devices.h"
#include "tools/doctor/doctor_checks.h"
#include "tools/doctor/doctor_deep_probes.h"

namespace lockstep::tools {
namespace {

constexpr uint64_t kBytes = uint64_t{32} << 20;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

PeerCopyResult copy(int src, int dst, double gbps, const std::string& link = "NV18") {
  PeerCopyResult r;
  r.src = src;
  r.dst = dst;
  r.src_gpu = static_cast<unsigned>(src);
  r.dst_gpu = static_cast<unsigned>(dst);
  r.link = link;
  r.bytes = kBytes;
  r.repeats = 10;
  r.gbps = gbps;
  r.seconds = static_cast<double>(kBytes) * 10 / gbps / 1e9;
  return r;
}

GemmBurnResult burn(int device, double tflops, const std::string& name = "NVIDIA H100 80GB HBM3") {
  GemmBurnResult r;
  r.device = device;
  r.gpu = static_cast<unsigned>(device);
  r.name = name;
  r.dtype = "bf16";
  r.n = 8192;
  r.iterations = 500;
  r.seconds = 1.0;
  r.tflops = tflops;
  r.checked = 8192;
  return r;
}

// n GPUs, every ordered pair at `gbps`, every GPU at `tflops`.
DoctorInput probed(int n, double gbps = 390.0, double tflops = 610.0) {
  DoctorInput in;
  DeepProbes deep;
  deep.gpus = n;
  deep.timeout_seconds = 20;
  for (int i = 0; i < n; ++i) {
    deep.burns.push_back(burn(i, tflops + i * 0.5));
    for (int j = 0; j < n; ++j)
      if (i != j) deep.copies.push_back(copy(i, j, gbps + i + 0.1 * j));
  }
  in.deep = deep;
  return in;
}

PeerCopyResult& pair(DoctorInput& in, int src, int dst) {
  for (PeerCopyResult& r : in.deep->copies)
    if (r.src == src && r.dst == dst) return r;
  throw std::runtime_error("no such pair");
}

TEST(DoctorDeepChecks, AnIntactMatrixPassesWithItsBandwidths) {
  const Check c = check_peer_copies(probed(4));
  EXPECT_EQ(c.status, Status::kPass) << c.summary;
  EXPECT_TRUE(contains(c.summary, "12 ordered pairs of 4 GPUs copied 32 MiB each, byte for byte intact")) << c.summary;
  ASSERT_GE(c.details.size(), 6u);
  EXPECT_EQ(c.details[1], "        cuda:0  cuda:1  cuda:2  cuda:3");
  EXPECT_EQ(c.details[2], "cuda:0  X       390.1   390.2   390.3");
  EXPECT_EQ(check_gemm_burn(probed(4)).status, Status::kPass);
}

TEST(DoctorDeepChecks, APairReturningZerosFailsNamingItTheCountAndTheFirstOffset) {
  DoctorInput in = probed(4);
  PeerCopyResult& bad = pair(in, 1, 2);
  bad.mismatches = kBytes - 131072;  // the pattern's own zero bytes match
  bad.first_mismatch = 0;
  bad.zeros = true;
  const Check c = check_peer_copies(in);
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_TRUE(contains(c.summary,
                       "cuda:1 → cuda:2 (GPU 1 → GPU 2) delivered wrong bytes: 33423360 of 33554432 "
                       "differ, the first at offset 0 (the destination holds zeros)"))
      << c.summary;
  EXPECT_FALSE(contains(c.summary, "cuda:2 → cuda:1")) << c.summary;
  EXPECT_TRUE(contains(c.fix, "iommu=pt")) << c.fix;
  EXPECT_TRUE(contains(c.fix, "ACS")) << c.fix;
  EXPECT_TRUE(contains(c.details[3], "WRONG")) << c.details[3];
}

TEST(DoctorDeepChecks, APairFarSlowerThanTheOthersOfItsLinkWarns) {
  DoctorInput in = probed(4);
  pair(in, 3, 0).gbps = 21.5;
  Check c = check_peer_copies(in);
  EXPECT_EQ(c.status, Status::kWarn) << c.summary;
  EXPECT_TRUE(contains(c.summary, "cuda:3 → cuda:0 (GPU 3 → GPU 0) at 21.5 GB/s, below half the")) << c.summary;
  EXPECT_TRUE(contains(c.summary, "median of the NV18 pairs")) << c.summary;
  EXPECT_FALSE(contains(c.summary, "cuda:0 → cuda:1")) << c.summary;

  // A PCIe path is slower than NVLink by nature: pairs are compared within their link kind.
  in = probed(4);
  for (PeerCopyResult& r : in.deep->copies) {
    if ((r.src < 2) != (r.dst < 2)) {
      r.link = "SYS";
      r.gbps = 21.5;
    }
  }
  c = check_peer_copies(in);
  EXPECT_EQ(c.status, Status::kPass) << c.summary;
}

TEST(DoctorDeepChecks, ACopyThatDoesNotFinishFailsAsAHang) {
  DoctorInput in = probed(3);
  pair(in, 0, 2).outcome = ProbeOutcome::kHung;
  for (PeerCopyResult& r : in.deep->copies)
    if (r.src > 0) r.outcome = ProbeOutcome::kNotRun;
  in.deep->stopped = "the copy cuda:0 → cuda:2 hung";
  const Check c = check_peer_copies(in);
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_TRUE(contains(c.summary, "the copy cuda:0 → cuda:2 (GPU 0 → GPU 2) did not finish within 20 s: it hangs"))
      << c.summary;
  EXPECT_TRUE(contains(c.fix, "iommu=pt")) << c.fix;
  EXPECT_TRUE(contains(c.details[2], "HANG")) << c.details[2];
  EXPECT_TRUE(contains(c.details.back(), "not run: the copy cuda:0 → cuda:2 hung")) << c.details.back();
}

TEST(DoctorDeepChecks, ACopyErrorFails) {
  DoctorInput in = probed(2);
  pair(in, 1, 0).error = "cudaErrorIllegalAddress: an illegal memory access was encountered";
  const Check c = check_peer_copies(in);
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_TRUE(contains(c.summary, "cuda:1 → cuda:0 (GPU 1 → GPU 0) failed: cudaErrorIllegalAddress")) << c.summary;
}

TEST(DoctorDeepChecks, AGpuSlowerThanTheFastestOfItsModelWarnsNamingItsFigureAndTheOthers) {
  DoctorInput in = probed(4);
  in.deep->burns[2].tflops = 431.0;
  Check c = check_gemm_burn(in);
  EXPECT_EQ(c.status, Status::kWarn) << c.summary;
  EXPECT_TRUE(contains(c.summary, "cuda:2 (GPU 2) at 431.0 TFLOP/s")) << c.summary;
  EXPECT_TRUE(contains(c.summary, "cuda:0 (GPU 0) 610.0, cuda:1 (GPU 1) 610.5")) << c.summary;
  EXPECT_FALSE(contains(c.summary, "cuda:1 (GPU 1) at")) << c.summary;
  EXPECT_TRUE(contains(c.summary, "PCIe and NVLink are not the cause")) << c.summary;
  EXPECT_TRUE(contains(c.fix, "power")) << c.fix;
  EXPECT_TRUE(contains(c.fix, "lockstep top")) << c.fix;

  // Within 15% of the fastest is normal spread; another model is compared with its own kind.
  in = probed(4);
  in.deep->burns[1].tflops = 530.0;
  in.deep->burns[3] = burn(3, 250.0, "NVIDIA A100-SXM4-80GB");
  c = check_gemm_burn(in);
  EXPECT_EQ(c.status, Status::kPass) << c.summary;
}

TEST(DoctorDeepChecks, WrongProductsAndAHungGpuFail) {
  DoctorInput in = probed(2);
  in.deep->burns[1].wrong = 7;
  in.deep->burns[1].first_wrong = "C[3, 17] = 0 (expected 12.5)";
  Check c = check_gemm_burn(in);
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_TRUE(contains(c.summary,
                       "cuda:1 (GPU 1) computes wrong products: 7 of 8192 elements checked differ from the "
                       "CPU's, first C[3, 17] = 0 (expected 12.5)"))
      << c.summary;

  in = probed(2);
  in.deep->burns[0].outcome = ProbeOutcome::kHung;
  in.deep->burns[1].outcome = ProbeOutcome::kNotRun;
  c = check_gemm_burn(in);
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_TRUE(contains(c.summary, "the products on cuda:0 (GPU 0) did not finish")) << c.summary;
}

TEST(DoctorDeepChecks, OneGpuHasNoPairsButIsBurned) {
  const DoctorInput in = probed(1);
  const Check copies = check_peer_copies(in);
  EXPECT_EQ(copies.status, Status::kInfo);
  EXPECT_EQ(copies.summary, "one GPU: no pairs to copy between");
  const Check gemm = check_gemm_burn(in);
  EXPECT_EQ(gemm.status, Status::kPass) << gemm.summary;
  EXPECT_TRUE(contains(gemm.summary, "1 GPU multiplied 8192 x 8192 bf16 matrices at cuda:0 (GPU 0) 610.0 TFLOP/s"))
      << gemm.summary;
}

TEST(DoctorDeepChecks, NoCudaDeviceIsSkippedNeverAPass) {
  DoctorInput in;
  in.deep = DeepProbes{};
  in.deep->no_device_reason = "this build of Lockstep has no CUDA backend";
  for (const Check& c : {check_peer_copies(in), check_gemm_burn(in)}) {
    EXPECT_EQ(c.status, Status::kInfo) << c.name;
    EXPECT_EQ(c.summary, "skipped: no CUDA device (this build of Lockstep has no CUDA backend)") << c.name;
  }
  // In the report too, and only with --deep.
  auto names = [](const std::vector<Check>& checks) {
    std::vector<std::string> out;
    for (const Check& c : checks) out.push_back(c.name);
    return out;
  };
  const std::vector<std::string> deep = names(run_checks(in));
  EXPECT_NE(std::find(deep.begin(), deep.end(), "peer-copies"), deep.end());
  EXPECT_NE(std::find(deep.begin(), deep.end(), "gemm-burn"), deep.end());
  in.deep.reset();
  const std::vector<std::string> plain = names(run_checks(in));
  EXPECT_EQ(std::find(plain.begin(), plain.end(), "peer-copies"), plain.end());
  EXPECT_EQ(std::find(plain.begin(), plain.end(), "gemm-burn"), plain.end());
}

TEST(DoctorDeepChecks, ProbesThatCouldNotStartFail) {
  DoctorInput in;
  in.deep = DeepProbes{};
  in.deep->error = "counting the CUDA devices did not finish within 20 s: the driver hangs";
  EXPECT_EQ(check_peer_copies(in).status, Status::kFail);
  EXPECT_EQ(check_gemm_burn(in).status, Status::kFail);
}

TEST(DoctorDeepChecks, ProbedDevicesAreNamedAsNvmlNamesThem) {
  DoctorInput in = probed(2);
  for (auto& r : in.deep->copies) {
    r.src_gpu.reset();
    r.dst_gpu.reset();
    r.link.clear();
  }
  gpu::GpuState gpus;
  for (unsigned i = 0; i < 2; ++i) {
    gpu::GpuDevice d;
    d.index = i;
    d.name = i == 0 ? "Tesla V100-SXM2-32GB" : "Tesla T4";
    gpus.devices.push_back(d);
  }
  gpus.topology = {{{gpu::GpuLink::kSelf, 0}, {gpu::GpuLink::kSys, 0}},
                   {{gpu::GpuLink::kSys, 0}, {gpu::GpuLink::kSelf, 0}}};
  name_probed_gpus(*in.deep, gpus, {1, 0});  // cuda:0 is NVML's GPU 1
  EXPECT_EQ(pair(in, 0, 1).src_gpu, 1u);
  EXPECT_EQ(pair(in, 0, 1).dst_gpu, 0u);
  EXPECT_EQ(pair(in, 0, 1).link, "SYS");
  EXPECT_EQ(in.deep->burns[0].name, "Tesla T4");
  EXPECT_EQ(in.deep->burns[1].gpu, 0u);
}

TEST(DoctorDeepProbes, TheDeadlineWorkerReturnsValuesAndGivesUpOnAHang) {
  DeadlineWorker worker;
  int value = 0;
  EXPECT_EQ(worker.run<int>(
                std::chrono::seconds(10), [] { return 42; }, &value),
            ProbeOutcome::kFinished);
  EXPECT_EQ(value, 42);
  EXPECT_THROW(worker.run<int>(
                   std::chrono::seconds(10), []() -> int { throw std::runtime_error("boom"); }, &value),
               std::runtime_error);

  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(worker.run<int>(
                std::chrono::milliseconds(200),
                [released] {
                  released.wait();  // a copy stuck in the driver
                  return 7;
                },
                &value),
            ProbeOutcome::kHung);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(worker.hung());
  EXPECT_EQ(worker.run<int>(
                std::chrono::seconds(10), [] { return 1; }, &value),
            ProbeOutcome::kNotRun);
  EXPECT_EQ(value, 42);
  release->set_value();  // lets the abandoned thread finish
}

TEST(DoctorDeepProbes, ComparingBytesFindsTheFirstDifferenceAndZeros) {
  const std::vector<uint8_t> pattern = copy_pattern(4096);
  ByteComparison same = compare_bytes(pattern, pattern);
  EXPECT_EQ(same.mismatches, 0u);
  EXPECT_FALSE(same.zeros);
  std::vector<uint8_t> flipped = pattern;
  flipped[1000] ^= 0x10;
  flipped[3000] ^= 0x01;
  const ByteComparison two = compare_bytes(flipped, pattern);
  EXPECT_EQ(two.mismatches, 2u);
  EXPECT_EQ(two.first, 1000u);
  const ByteComparison zeros = compare_bytes(std::vector<uint8_t>(4096, 0), pattern);
  EXPECT_TRUE(zeros.zeros);
  EXPECT_GT(zeros.mismatches, 4000u);
  EXPECT_LT(zeros.first, 16u);
}

TEST(DoctorDeepProbes, ACopyBetweenCpuDevicesArrivesIntactAndIsTimed) {
  const std::vector<uint8_t> pattern = copy_pattern(uint64_t{1} << 20);
  const Device dst = Device::cpu(host_cores() > 1 ? 1 : 0);
  const Tensor source = Tensor::from_vector(pattern, {static_cast<int64_t>(pattern.size())}, Device::cpu(0));
  const PeerCopyResult r = probe_peer_copy(source, dst, pattern, 3);
  EXPECT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.mismatches, 0u);
  EXPECT_EQ(r.bytes, uint64_t{1} << 20);
  EXPECT_GT(r.gbps, 0);
}

TEST(DoctorDeepProbes, TheBurnOnACpuDeviceMatchesTheExactReference) {
  const GemmOperands operands = gemm_operands(96);
  const GemmBurnResult r = probe_gemm_burn(Device::cpu(0), operands, 0.05);
  EXPECT_TRUE(r.ok()) << r.error << r.first_wrong;
  EXPECT_EQ(r.checked, 2 * 64 * 64);
  EXPECT_EQ(r.wrong, 0);
  EXPECT_GE(r.iterations, 1);
  EXPECT_GT(r.tflops, 0);
  EXPECT_EQ(r.dtype, "f32");
}

TEST(DoctorDeepProbes, AWrongElementIsFoundAgainstTheReference) {
  const GemmOperands operands = gemm_operands(32);
  std::vector<float> block(16 * 16);
  for (int64_t i = 0; i < 16; ++i) {
    for (int64_t j = 0; j < 16; ++j) {
      float sum = 0;
      for (int64_t k = 0; k < 32; ++k) sum += operands.a[(8 + i) * 32 + k] * operands.b[k * 32 + 4 + j];
      block[i * 16 + j] = sum;
    }
  }
  std::string first;
  EXPECT_EQ(wrong_elements(operands, 8, 4, 16, block, &first), 0);
  block[5 * 16 + 9] += 0.5f;
  block[7 * 16 + 2] += 1.0f;
  EXPECT_EQ(wrong_elements(operands, 8, 4, 16, block, &first), 2);
  EXPECT_EQ(first.rfind("C[13, 13] = ", 0), 0u) << first;
}

TEST(DoctorDeepProbes, WithoutACudaDeviceNothingRunsAndTheReasonIsGiven) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  const DeepProbes deep = run_deep_probes({});
  EXPECT_EQ(deep.gpus, 0);
  EXPECT_FALSE(deep.no_device_reason.empty());
  EXPECT_TRUE(deep.copies.empty());
  EXPECT_TRUE(deep.burns.empty());
  EXPECT_TRUE(deep.error.empty()) << deep.error;
}

// On a GPU machine (the GPU check runs these with LOCKSTEP_REQUIRE_CUDA=1): the probes on the
// real devices give intact copies and products that match the CPU's.
TEST(DoctorDeepProbes, OnCudaTheBurnMatchesTheCpuAndEveryCopyArrivesIntact) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(Device(DeviceType::cuda, 0));
  const GemmBurnResult one = probe_gemm_burn(Device(DeviceType::cuda, 0), gemm_operands(1024), 0.2);
  EXPECT_TRUE(one.ok()) << one.error << one.first_wrong;
  EXPECT_EQ(one.dtype, "bf16");
  EXPECT_EQ(one.checked, 2 * 64 * 64);
  EXPECT_GT(one.tflops, 0);

  DeepOptions options;
  options.timeout = std::chrono::seconds(60);
  options.burn_seconds = 0.2;
  options.gemm_n = 2048;
  options.copy_bytes = uint64_t{4} << 20;
  options.copy_repeats = 3;
  const DeepProbes deep = run_deep_probes(options);
  EXPECT_TRUE(deep.error.empty()) << deep.error;
  EXPECT_TRUE(deep.stopped.empty()) << deep.stopped;
  ASSERT_GE(deep.gpus, 1);
  ASSERT_EQ(deep.burns.size(), static_cast<size_t>(deep.gpus));
  for (const GemmBurnResult& r : deep.burns) {
    EXPECT_TRUE(r.ok()) << "cuda:" << r.device << ": " << r.error << r.first_wrong;
    EXPECT_GT(r.tflops, 0);
  }
  EXPECT_EQ(deep.copies.size(), static_cast<size_t>(deep.gpus * (deep.gpus - 1)));
  for (const PeerCopyResult& r : deep.copies) {
    EXPECT_TRUE(r.ok()) << "cuda:" << r.src << " -> cuda:" << r.dst << ": " << r.error << " " << r.mismatches
                        << " bytes differ";
    EXPECT_GT(r.gbps, 0);
  }
  DoctorInput in;
  in.deep = deep;
  EXPECT_NE(check_gemm_burn(in).status, Status::kFail) << check_gemm_burn(in).summary;
  EXPECT_NE(check_peer_copies(in).status, Status::kFail) << check_peer_copies(in).summary;
}

// Two logical devices: on one GPU with LOCKSTEP_CUDA_DEVICES_PER_GPU=2, or two GPUs.
TEST(DoctorDeepProbes, OnCudaACopyBetweenTwoDevicesIsIntact) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(Device(DeviceType::cuda, 0), 2);
  const std::vector<uint8_t> pattern = copy_pattern(uint64_t{8} << 20);
  const Tensor source =
      Tensor::from_vector(pattern, {static_cast<int64_t>(pattern.size())}, Device(DeviceType::cuda, 0));
  const PeerCopyResult r = probe_peer_copy(source, Device(DeviceType::cuda, 1), pattern, 3);
  EXPECT_TRUE(r.ok()) << r.error << " " << r.mismatches << " bytes differ";
  EXPECT_GT(r.gbps, 0);
}

}  // namespace
}  // namespace lockstep::tools
