// `lockstep doctor --deep`'s probes (doctor_deep_probes.h). Every GPU call goes through the
// library: tensors moved with copy_from / to(Device), matmul under autocast, and
// lockstep::cuda for counting and synchronizing, so this file builds with and without the
// CUDA backend (without it, device_count() is 0 and nothing runs).
#include "tools/doctor/doctor_deep_probes.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "lockstep/core/autocast.h"
#include "lockstep/core/cuda_device.h"
#include "lockstep/core/philox.h"
#include "lockstep/ops/linalg.h"

namespace lockstep::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kPatternSeed = 0x6c6f636b73746570;  // "lockstep"
constexpr uint64_t kPatternStream = static_cast<uint64_t>(RngStream::user) + 17;
constexpr uint64_t kOperandStream = static_cast<uint64_t>(RngStream::user) + 18;

double elapsed(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Waits for the work queued on a device (CPU devices run copies and products synchronously).
void wait_for(Device device) {
  if (device.is_cuda()) cuda::synchronize(device);
}

std::string seconds_text(std::chrono::milliseconds limit) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", static_cast<double>(limit.count()) / 1000);
  return text;
}

std::string device_text(int device) { return std::string("cuda:") + std::to_string(device); }

}  // namespace

struct DeadlineWorker::State {
  std::mutex mutex;
  std::condition_variable changed;
  std::function<void()> job;
  bool pending = false, done = false, stop = false;
  std::exception_ptr failure;
};

DeadlineWorker::DeadlineWorker() : state_(std::make_shared<State>()) {
  std::thread([state = state_] {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(state->mutex);
        state->changed.wait(lock, [&] { return state->pending || state->stop; });
        if (!state->pending) return;
        job = std::move(state->job);
        state->pending = false;
      }
      std::exception_ptr failure;
      try {
        job();
      } catch (...) {
        failure = std::current_exception();
      }
      job = nullptr;  // what it holds is released here, on this thread
      {
        std::lock_guard<std::mutex> lock(state->mutex);
        state->failure = failure;
        state->done = true;
      }
      state->changed.notify_all();
    }
  }).detach();
}

DeadlineWorker::~DeadlineWorker() {
  // An idle thread ends now; one stuck in a hung job ends if the job ever returns.
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->changed.notify_all();
}

ProbeOutcome DeadlineWorker::run_job(std::chrono::milliseconds limit, std::function<void()> job) {
  if (hung_) return ProbeOutcome::kNotRun;
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->job = std::move(job);
  state_->pending = true;
  state_->done = false;
  state_->failure = nullptr;
  state_->changed.notify_all();
  if (!state_->changed.wait_for(lock, limit, [&] { return state_->done; })) {
    hung_ = true;
    return ProbeOutcome::kHung;
  }
  if (state_->failure) {
    const std::exception_ptr failure = state_->failure;
    state_->failure = nullptr;
    lock.unlock();
    std::rethrow_exception(failure);
  }
  return ProbeOutcome::kFinished;
}

std::vector<uint8_t> copy_pattern(uint64_t bytes) {
  std::vector<uint8_t> pattern(bytes);
  for (uint64_t offset = 0; offset < bytes; offset += 16) {
    const std::array<uint32_t, 4> words = philox4x32(kPatternSeed, kPatternStream, offset / 16);
    for (uint64_t k = 0; k < 16 && offset + k < bytes; ++k) {
      pattern[offset + k] = static_cast<uint8_t>(words[k / 4] >> (8 * (k % 4)));
    }
  }
  return pattern;
}

ByteComparison compare_bytes(const std::vector<uint8_t>& received, const std::vector<uint8_t>& expected) {
  ByteComparison out;
  const size_t n = std::min(received.size(), expected.size());
  out.zeros = !received.empty();
  for (size_t i = 0; i < n; ++i) {
    if (received[i] != 0) out.zeros = false;
    if (received[i] != expected[i]) {
      if (out.mismatches == 0) out.first = i;
      ++out.mismatches;
    }
  }
  // A short buffer: the missing bytes differ too.
  if (received.size() != expected.size()) {
    const size_t longer = std::max(received.size(), expected.size());
    if (out.mismatches == 0) out.first = n;
    out.mismatches += longer - n;
  }
  return out;
}

PeerCopyResult probe_peer_copy(const Tensor& source, Device dst, const std::vector<uint8_t>& pattern, int repeats) {
  PeerCopyResult r;
  r.src = source.device().index();
  r.dst = dst.index();
  r.bytes = pattern.size();
  r.repeats = repeats;
  try {
    // The first copy pays for enabling peer access and the path's first use.
    const Tensor received = source.to(dst);
    wait_for(dst);
    received.zero();
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < repeats; ++i) received.copy_from(source);
    wait_for(dst);
    r.seconds = elapsed(start);
    r.gbps = r.seconds > 0 ? static_cast<double>(r.bytes) * repeats / r.seconds / 1e9 : 0;
    const ByteComparison compared = compare_bytes(received.to_vector<uint8_t>(), pattern);
    r.mismatches = compared.mismatches;
    r.first_mismatch = compared.first;
    r.zeros = compared.zeros;
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

GemmOperands gemm_operands(int64_t n) {
  GemmOperands out;
  out.n = n;
  const size_t count = static_cast<size_t>(n * n);
  uint64_t counter = 0;
  for (std::vector<float>* matrix : {&out.a, &out.b}) {
    matrix->resize(count);
    for (size_t i = 0; i < count; i += 16) {
      const std::array<uint32_t, 4> words = philox4x32(kPatternSeed, kOperandStream, counter++);
      for (size_t k = 0; k < 16 && i + k < count; ++k) {
        const unsigned byte = (words[k / 4] >> (8 * (k % 4))) & 0xff;
        (*matrix)[i + k] = static_cast<float>(static_cast<int>(byte % 17) - 8) / 8.0f;
      }
    }
  }
  return out;
}

int64_t wrong_elements(const GemmOperands& operands, int64_t row, int64_t col, int64_t size,
                       const std::vector<float>& block, std::string* first_wrong) {
  const int64_t n = operands.n;
  int64_t wrong = 0;
  for (int64_t i = 0; i < size; ++i) {
    for (int64_t j = 0; j < size; ++j) {
      double expected = 0;
      for (int64_t k = 0; k < n; ++k) {
        expected += static_cast<double>(operands.a[static_cast<size_t>((row + i) * n + k)]) *
                    operands.b[static_cast<size_t>(k * n + col + j)];
      }
      const size_t at = static_cast<size_t>(i * size + j);
      const double got = at < block.size() ? block[at] : std::nan("");
      // Exact in f32 from bf16 operands; the tolerance only allows for another summation order.
      if (std::fabs(got - expected) <= 1e-3 * (1 + std::fabs(expected))) continue;
      if (wrong++ == 0 && first_wrong != nullptr) {
        char text[128];
        std::snprintf(text, sizeof(text), "C[%lld, %lld] = %g (expected %g)", static_cast<long long>(row + i),
                      static_cast<long long>(col + j), got, expected);
        *first_wrong = text;
      }
    }
  }
  return wrong;
}

GemmBurnResult probe_gemm_burn(Device device, const GemmOperands& operands, double seconds) {
  GemmBurnResult r;
  r.device = device.index();
  r.n = operands.n;
  r.dtype = device.is_cuda() ? "bf16" : "f32";
  const int64_t n = operands.n;
  try {
    const Tensor a = Tensor::from_vector(operands.a, {n, n}, device);
    const Tensor b = Tensor::from_vector(operands.b, {n, n}, device);
    // bf16 tensor cores, as training runs them; CPU devices ignore autocast.
    const AutocastGuard autocast(device.is_cuda() ? DType::bf16 : DType::f32);
    // A scalar copied back waits for every product queued before it.
    auto finish = [](const Tensor& c) { (void)c.as_strided({1}, {1}, 0).item(); };
    Tensor c = matmul(a, b);  // warm-up: cuBLAS loaded, its workspace and the scratch allocated
    finish(c);
    Clock::time_point start = Clock::now();
    c = matmul(a, b);
    finish(c);
    const double one = std::max(elapsed(start), 1e-6);
    r.iterations = static_cast<int>(std::clamp(std::ceil(seconds / one), 1.0, 100000.0));
    start = Clock::now();
    for (int i = 0; i < r.iterations; ++i) c = matmul(a, b);
    finish(c);
    r.seconds = elapsed(start);
    r.tflops = 2.0 * static_cast<double>(n) * n * n * r.iterations / std::max(r.seconds, 1e-9) / 1e12;
    // The last product's corners against the CPU: the first rows and columns, and the last.
    const int64_t size = std::min<int64_t>(64, n);
    std::set<int64_t> corners = {0, n - size};
    for (int64_t corner : corners) {
      const std::vector<float> block = c.as_strided({size, size}, {n, 1}, corner * n + corner).to_vector<float>();
      std::string first;
      const int64_t wrong = wrong_elements(operands, corner, corner, size, block, &first);
      if (wrong > 0 && r.wrong == 0) r.first_wrong = first;
      r.wrong += wrong;
      r.checked += size * size;
    }
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

DeepProbes run_deep_probes(const DeepOptions& options) {
  DeepProbes deep;
  deep.timeout_seconds = static_cast<double>(options.timeout.count()) / 1000;
  if (!cuda::built()) {
    deep.no_device_reason = cuda::unavailable_reason();
    return deep;
  }
  DeadlineWorker worker;
  // One logical device per GPU: with LOCKSTEP_CUDA_DEVICES_PER_GPU, several share one.
  struct Found {
    std::vector<int> devices;
    std::string reason;
    int per_gpu = 1;
  };
  Found found;
  try {
    const ProbeOutcome counted = worker.run<Found>(
        options.timeout,
        [] {
          Found f;
          const int logical = cuda::device_count();
          if (logical == 0) f.reason = cuda::unavailable_reason();
          f.per_gpu = cuda::devices_per_gpu();
          std::set<int> gpus;
          for (int d = 0; d < logical; ++d) {
            if (gpus.insert(cuda::physical_device(Device(DeviceType::cuda, d))).second) f.devices.push_back(d);
          }
          return f;
        },
        &found);
    if (counted != ProbeOutcome::kFinished) {
      deep.error = std::string("counting the CUDA devices did not finish within ") + seconds_text(options.timeout) +
                   ": the driver hangs";
      deep.stopped = "counting the CUDA devices hung";
      return deep;
    }
  } catch (const std::exception& e) {
    deep.error = std::string("counting the CUDA devices failed: ") + e.what();
    return deep;
  }
  deep.gpus = static_cast<int>(found.devices.size());
  deep.no_device_reason = found.reason;
  deep.devices_per_gpu = found.per_gpu;
  if (deep.gpus == 0) return deep;

  // The GEMM burn, one GPU after another. What a job holds is shared, so a job that hangs
  // never reads memory this function has freed.
  const auto operands = std::make_shared<const GemmOperands>(gemm_operands(options.gemm_n));
  const auto burn_limit =
      options.timeout + std::chrono::milliseconds(static_cast<int64_t>(options.burn_seconds * 1000));
  for (int device : found.devices) {
    GemmBurnResult r;
    r.device = device;
    r.n = options.gemm_n;
    r.dtype = "bf16";
    const double seconds = options.burn_seconds;
    try {
      r.outcome = worker.run<GemmBurnResult>(
          burn_limit,
          [device, operands, seconds] { return probe_gemm_burn(Device(DeviceType::cuda, device), *operands, seconds); },
          &r);
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    if (r.outcome == ProbeOutcome::kHung) {
      r.seconds = seconds;
      deep.stopped = std::string("the products on ") + device_text(device) + " hung";
    }
    deep.burns.push_back(r);
  }
  if (deep.gpus < 2) return deep;

  // The copy matrix: the pattern uploaded to each GPU (and read back, so a bad host link is
  // not blamed on a pair), then every ordered pair.
  const auto pattern = std::make_shared<const std::vector<uint8_t>>(copy_pattern(options.copy_bytes));
  const auto sources = std::make_shared<std::map<int, Tensor>>();  // touched on the worker only
  std::map<int, std::string> source_errors;
  for (int device : found.devices) {
    std::string error;
    ProbeOutcome outcome = ProbeOutcome::kNotRun;
    try {
      outcome = worker.run<std::string>(
          options.timeout,
          [device, pattern, sources] {
            try {
              const Tensor t = Tensor::from_vector(*pattern, {static_cast<int64_t>(pattern->size())},
                                                   Device(DeviceType::cuda, device));
              const ByteComparison back = compare_bytes(t.to_vector<uint8_t>(), *pattern);
              (*sources)[device] = t;
              if (back.mismatches == 0) return std::string();
              return std::string("the pattern copied to ") + device_text(device) + " read back with " +
                     std::to_string(back.mismatches) + " bytes changed (the host's copies to that GPU are wrong)";
            } catch (const std::exception& e) {
              return std::string("copying the pattern to ") + device_text(device) + " failed: " + e.what();
            }
          },
          &error);
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (outcome == ProbeOutcome::kHung && deep.stopped.empty())
      deep.stopped = std::string("copying the pattern to ") + device_text(device) + " hung";
    source_errors[device] = error;
  }
  for (int src : found.devices) {
    for (int dst : found.devices) {
      if (src == dst) continue;
      PeerCopyResult r;
      r.src = src;
      r.dst = dst;
      r.bytes = options.copy_bytes;
      r.repeats = options.copy_repeats;
      if (worker.hung()) {
        r.outcome = ProbeOutcome::kNotRun;
      } else if (!source_errors[src].empty()) {
        r.error = source_errors[src];
      } else {
        const int repeats = options.copy_repeats;
        try {
          r.outcome = worker.run<PeerCopyResult>(
              options.timeout,
              [src, dst, pattern, sources, repeats] {
                return probe_peer_copy(sources->at(src), Device(DeviceType::cuda, dst), *pattern, repeats);
              },
              &r);
        } catch (const std::exception& e) {
          r.error = e.what();
        }
        if (r.outcome == ProbeOutcome::kHung)
          deep.stopped = std::string("the copy ") + device_text(src) + " → " + device_text(dst) + " hung";
      }
      deep.copies.push_back(r);
    }
  }
  return deep;
}

}  // namespace lockstep::tools
