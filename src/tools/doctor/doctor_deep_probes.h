// `lockstep doctor --deep`'s probes: they run the GPUs, through the library (tensors on
// cuda:N, matmul, lockstep::cuda), and return plain results for the rules in
// doctor_deep_checks.cpp. Each probe runs on a worker thread with a deadline, so a copy that
// hangs in the driver (PCIe servers with ACS or the IOMMU on) is reported as a hang instead
// of hanging doctor. The pieces take any device, so the tests run them on CPU devices.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core/tensor.h"
#include "tools/doctor/doctor_checks.h"

namespace lockstep::tools {

struct DeepOptions {
  std::chrono::milliseconds timeout{20000};  // each probe's deadline (a burn gets burn_seconds more)
  double burn_seconds = 1.0;                 // how long each GPU multiplies
  int64_t gemm_n = 8192;                     // the products' size: n x n by n x n
  uint64_t copy_bytes = uint64_t{32} << 20;  // the buffer each pair copies
  int copy_repeats = 10;                     // timed copies per pair
};

// Every probe on every GPU CUDA sees (one device per GPU when several share one): the GEMM
// burn per GPU, then each ordered pair's copy. Never throws; after a probe hangs, the ones
// left are reported as not run. Without a CUDA device (or a build without CUDA) it returns
// at once with gpus = 0 and the reason.
DeepProbes run_deep_probes(const DeepOptions& options);

// Runs jobs one at a time on a thread of its own and waits for each until its deadline. A job
// that misses it is abandoned where it hangs (the thread stays blocked in it; nothing it
// touches is read again) and every later job is refused: a hung GPU call must not hang the
// caller. A job's exception is rethrown by run.
class DeadlineWorker {
 public:
  DeadlineWorker();
  ~DeadlineWorker();
  DeadlineWorker(const DeadlineWorker&) = delete;
  DeadlineWorker& operator=(const DeadlineWorker&) = delete;

  // kFinished with *out set; kHung when fn did not return within limit; kNotRun once hung.
  template <typename T>
  ProbeOutcome run(std::chrono::milliseconds limit, std::function<T()> fn, T* out) {
    auto slot = std::make_shared<T>();
    const ProbeOutcome outcome = run_job(limit, [slot, fn = std::move(fn)] { *slot = fn(); });
    if (outcome == ProbeOutcome::kFinished) *out = std::move(*slot);
    return outcome;
  }
  bool hung() const { return hung_; }

 private:
  struct State;
  ProbeOutcome run_job(std::chrono::milliseconds limit, std::function<void()> job);
  std::shared_ptr<State> state_;
  bool hung_ = false;
};

// The copies' pattern: Philox bytes, so no two offsets repeat a run and zeros stand out.
std::vector<uint8_t> copy_pattern(uint64_t bytes);
struct ByteComparison {
  uint64_t mismatches = 0;
  uint64_t first = 0;  // the first differing offset
  bool zeros = false;  // every byte received is 0
};
ByteComparison compare_bytes(const std::vector<uint8_t>& received, const std::vector<uint8_t>& expected);
// Copies `source` (the pattern, on its device) to dst: once to warm up, `repeats` times timed,
// then reads the destination back and compares it with the pattern byte for byte.
PeerCopyResult probe_peer_copy(const Tensor& source, Device dst, const std::vector<uint8_t>& pattern, int repeats);

// The burn's operands: n x n matrices of multiples of 1/8 in [-1, 1], exact in bf16, whose
// products f32 accumulates exactly, so the CPU reference is exact too.
struct GemmOperands {
  int64_t n = 0;
  std::vector<float> a, b;  // row-major
};
GemmOperands gemm_operands(int64_t n);
// The elements of C = A B in the size x size block at (row, col), as `block` holds them
// (row-major), that differ from the exact product; the first one described in *first_wrong.
int64_t wrong_elements(const GemmOperands& operands, int64_t row, int64_t col, int64_t size,
                       const std::vector<float>& block, std::string* first_wrong);
// matmul on `device` for about `seconds` (bf16 through autocast on GPUs, f32 on CPUs), timed
// by copying a scalar of each product back; the last product's corner blocks checked.
GemmBurnResult probe_gemm_burn(Device device, const GemmOperands& operands, double seconds);

}  // namespace lockstep::tools
