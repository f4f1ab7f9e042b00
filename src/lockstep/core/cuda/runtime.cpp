#include "lockstep/core/cuda/runtime.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "lockstep/core/cuda_versions.h"
#include "lockstep/core/error.h"

namespace lockstep::cuda {

void check(cudaError_t rc, const char* call) {
  if (rc == cudaSuccess) return;
  cudaGetLastError();  // clears the error unless it is sticky
  LOCKSTEP_FAIL() << "CUDA: " << call << " failed: " << cudaGetErrorName(rc) << ": " << cudaGetErrorString(rc);
}

bool built() { return true; }

int devices_per_gpu() {
  static const int per_gpu = [] {
    const char* text = std::getenv("LOCKSTEP_CUDA_DEVICES_PER_GPU");
    if (text == nullptr || *text == '\0') return 1;
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    LOCKSTEP_CHECK(*end == '\0' && value >= 1 && value <= 64)
        << "LOCKSTEP_CUDA_DEVICES_PER_GPU=" << text << " is not a count from 1 to 64";
    return static_cast<int>(value);
  }();
  return per_gpu;
}

namespace {

struct GpuCount {
  int count = 0;
  std::string error;  // why counting failed: no driver, a driver too old, no GPU
};

const GpuCount& gpu_count() {
  static const GpuCount counted = [] {
    GpuCount c;
    // No driver, no GPU or a broken install all mean no CUDA devices here; the error is
    // kept, for whoever asks why.
    if (const cudaError_t rc = cudaGetDeviceCount(&c.count); rc != cudaSuccess) {
      cudaGetLastError();
      c.count = 0;
      c.error = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc);
    } else if (c.count == 0) {
      c.error = "the CUDA runtime sees no GPU";
    }
    if (!c.error.empty()) {
      int driver = 0, runtime = 0;
      cudaDriverGetVersion(&driver);  // 0 when no driver is loaded, which is what it says
      cudaRuntimeGetVersion(&runtime);
      cudaGetLastError();
      c.error += "; " + explain_cuda_versions(driver, runtime);
      if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
        c.error += std::string(" (CUDA_VISIBLE_DEVICES='") + visible + "')";
      }
    }
    return c;
  }();
  return counted;
}

}  // namespace

int device_count() { return gpu_count().count * devices_per_gpu(); }

std::string unavailable_reason() { return gpu_count().error; }

int physical_device(Device device) {
  LOCKSTEP_CHECK(device.is_cuda()) << device << " is not a CUDA device";
  const int count = device_count();
  LOCKSTEP_CHECK(device.index() >= 0 && device.index() < count)
      << "device " << device << " does not exist: "
      << (count == 0 ? "no GPU is visible to this process (" + unavailable_reason() +
                           "; check nvidia-smi and CUDA_VISIBLE_DEVICES)"
                     : "this process sees cuda:0 to cuda:" + std::to_string(count - 1));
  return device.index() / devices_per_gpu();
}

cudaStream_t stream(Device device) {
  // Every op asks for its stream: each thread keeps the ones it has seen, so only its first
  // use of a device takes the lock (the streams themselves are one per device, shared).
  thread_local std::vector<cudaStream_t> seen;
  const auto index = static_cast<size_t>(device.index());
  if (device.is_cuda() && index < seen.size() && seen[index] != nullptr) return seen[index];
  static std::mutex mutex;
  static auto* streams = new std::vector<cudaStream_t>();  // never freed: tensors outlive statics
  physical_device(device);                                 // a clear error for a device that does not exist
  std::lock_guard<std::mutex> lock(mutex);
  if (streams->empty()) streams->resize(static_cast<size_t>(device_count()), nullptr);
  cudaStream_t& s = (*streams)[index];
  if (s == nullptr) {
    const DeviceScope scope(device);  // a stream belongs to the GPU current at its creation
    LOCKSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  if (seen.size() <= index) seen.resize(index + 1, nullptr);
  seen[index] = s;
  return s;
}

namespace {
constexpr int kMaxGpus = 1024;
std::atomic<bool> used_gpus[kMaxGpus];  // zero-initialized: none yet
}  // namespace

void mark_gpu_used(int gpu) {
  if (gpu >= 0 && gpu < kMaxGpus) used_gpus[gpu].store(true);
}

bool gpu_used(int gpu) { return gpu >= kMaxGpus || (gpu >= 0 && used_gpus[gpu].load()); }

DeviceScope::DeviceScope(Device device) {
  const int physical = physical_device(device);
  LOCKSTEP_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ == physical) {
    previous_ = -1;
  } else {
    LOCKSTEP_CUDA_CHECK(cudaSetDevice(physical));
  }
  mark_gpu_used(physical);
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0 && gpu_used(previous_)) cudaSetDevice(previous_);
}

void stream_wait(cudaStream_t waiting, cudaStream_t producer) {
  if (waiting == producer) return;
  cudaEvent_t event = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(event, producer);
  const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(waiting, event, 0) : recorded;
  cudaEventDestroy(event);  // released once the wait has happened
  LOCKSTEP_CUDA_CHECK(waited);
}

void synchronize(Device device) {
  const cudaStream_t s = stream(device);
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
}

namespace {

struct Traffic {
  std::mutex mutex;
  std::condition_variable changed;
  int in_flight = 0;     // open CommunicationScopes
  bool freeing = false;  // a without_communication is waiting or running
};

Traffic& traffic(int gpu) {
  static std::mutex mutex;
  static auto* all = new std::map<int, Traffic*>();  // never freed: lanes may outlive statics
  std::lock_guard<std::mutex> lock(mutex);
  Traffic*& t = (*all)[gpu];
  if (t == nullptr) t = new Traffic();
  return *t;
}

// The GPUs of the scopes the calling thread has open.
thread_local std::vector<int> open_scopes;

}  // namespace

CommunicationScope::CommunicationScope(int gpu) : gpu_(gpu) {
  Traffic& t = traffic(gpu);
  std::unique_lock<std::mutex> lock(t.mutex);
  t.changed.wait(lock, [&] { return !t.freeing; });
  ++t.in_flight;
  open_scopes.push_back(gpu);
}

CommunicationScope::~CommunicationScope() {
  Traffic& t = traffic(gpu_);
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    --t.in_flight;
    const auto mine = std::find(open_scopes.rbegin(), open_scopes.rend(), gpu_);
    if (mine != open_scopes.rend()) open_scopes.erase(std::next(mine).base());
  }
  t.changed.notify_all();
}

void without_communication(int gpu, const char* what, const std::function<void()>& body) {
  LOCKSTEP_CHECK(std::find(open_scopes.begin(), open_scopes.end(), gpu) == open_scopes.end())
      << what << " on GPU " << gpu << " would wait for every stream of the GPU (cudaFree synchronizes it), "
      << "the NCCL call this thread is making included, which could never finish: not waiting. Free memory "
      << "outside the collective, or make it need less";
  Traffic& t = traffic(gpu);
  {
    std::unique_lock<std::mutex> lock(t.mutex);
    t.changed.wait(lock, [&] { return !t.freeing; });  // one free of the GPU at a time
    t.freeing = true;
    t.changed.wait(lock, [&] { return t.in_flight == 0; });
  }
  const auto done = [&] {
    {
      std::lock_guard<std::mutex> lock(t.mutex);
      t.freeing = false;
    }
    t.changed.notify_all();
  };
  try {
    body();
  } catch (...) {
    done();
    throw;
  }
  done();
}

namespace {
std::atomic<bool> tf32{false};
}  // namespace

void set_allow_tf32(bool allow) { tf32.store(allow); }
bool allow_tf32() { return tf32.load(); }

}  // namespace lockstep::cuda
