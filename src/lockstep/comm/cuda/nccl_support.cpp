#include "lockstep/comm/cuda/nccl_support.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "lockstep/comm/store.h"
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/core/error.h"

namespace lockstep::comm::nccl {
namespace {

// How long a healthy communicator may take to flush at destruction before it is aborted.
constexpr std::chrono::seconds kCloseTimeout{10};
// Scratch grows in steps of this much, so that slowly growing sizes do not reallocate often.
constexpr size_t kDeviceGranule = size_t{2} << 20;

// Spins briefly (collectives of small tensors finish in microseconds), then sleeps so that a
// long wait does not burn a core the training step needs.
class Backoff {
 public:
  void pause() {
    if (++polls_ < 2000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  int polls_ = 0;
};

std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return std::chrono::steady_clock::now() + detail::clamp_timeout(timeout);
}

std::string timeout_message(const std::string& what, std::chrono::milliseconds timeout) {
  return what + " did not complete within " + detail::seconds_text(timeout) +
         " s: a peer rank died, hung, or has not made the matching call; the NCCL communicator was aborted "
         "(LOCKSTEP_COMM_TIMEOUT sets the limit in seconds)";
}

}  // namespace

void check_cuda(cudaError_t rc, const char* call) {
  if (rc == cudaSuccess) return;
  cudaGetLastError();  // clears the error unless it is sticky
  throw CommError(std::string("nccl backend: ") + call + " failed: " + cudaGetErrorName(rc) + ": " +
                  cudaGetErrorString(rc));
}

void check_nccl(ncclResult_t rc, const char* call) {
  if (rc == ncclSuccess) return;
  throw CommError(std::string("nccl backend: ") + call + " failed: " + ncclGetErrorString(rc));
}

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
  }
  LOCKSTEP_FAIL() << "nccl backend: no NCCL type for dtype " << dtype_name(dtype);
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
    case ReduceOp::rounded_sum:
      break;  // NCCL's own algorithms round where they please: only the tree mode has it
  }
  LOCKSTEP_FAIL() << "nccl backend: no NCCL reduction for " << reduce_op_name(op)
                  << "; Lockstep's tree mode has it (unset LOCKSTEP_NCCL_DETERMINISTIC=0)";
  return ncclSum;
}

std::string to_hex(const ncclUniqueId& id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  text.reserve(2 * sizeof id.internal);
  for (char c : id.internal) {
    const auto byte = static_cast<unsigned char>(c);
    text.push_back(kDigits[byte >> 4]);
    text.push_back(kDigits[byte & 15]);
  }
  return text;
}

ncclUniqueId from_hex(const std::string& text, const std::string& key) {
  ncclUniqueId id;
  auto digit = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  bool valid = text.size() == 2 * sizeof id.internal;
  for (size_t i = 0; valid && i < sizeof id.internal; ++i) {
    const int high = digit(text[2 * i]);
    const int low = digit(text[2 * i + 1]);
    valid = high >= 0 && low >= 0;
    id.internal[i] = static_cast<char>(high * 16 + low);
  }
  LOCKSTEP_CHECK(valid) << "nccl backend: the store's value at '" << key << "' is not an NCCL unique id ("
                        << text.size() << " characters, expected " << 2 * sizeof id.internal
                        << " hex digits); is another job using the same store keys?";
  return id;
}

// ---- CurrentDevice ----

CurrentDevice::CurrentDevice(int device) {
  int current = -1;
  LOCKSTEP_CUDA_CALL(cudaGetDevice(&current));
  if (current != device) {
    LOCKSTEP_CUDA_CALL(cudaSetDevice(device));
    previous_ = current;
  }
  lockstep::cuda::mark_gpu_used(device);
}

CurrentDevice::~CurrentDevice() {
  // Not onto a GPU this process never used: that would create a CUDA context there.
  if (previous_ >= 0 && lockstep::cuda::gpu_used(previous_)) cudaSetDevice(previous_);
}

// ---- Comm ----

std::unique_ptr<Comm> Comm::init(const ncclUniqueId& id, int nranks, int rank, std::chrono::milliseconds timeout,
                                 const std::string& what) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t raw = nullptr;
  const ncclResult_t rc = ncclCommInitRankConfig(&raw, nranks, id, rank, &config);
  if (raw == nullptr) {
    throw CommError("nccl backend: " + what + ": ncclCommInitRankConfig (rank " + std::to_string(rank) + " of " +
                    std::to_string(nranks) + ") failed: " + ncclGetErrorString(rc));
  }
  std::unique_ptr<Comm> comm(new Comm(raw));
  comm->check(rc, "ncclCommInitRankConfig", what, timeout);
  return comm;
}

std::unique_ptr<Comm> Comm::adopt(ncclComm_t raw, std::chrono::milliseconds timeout, const std::string& what) {
  std::unique_ptr<Comm> comm(new Comm(raw));
  comm->check(ncclInProgress, "ncclCommSplit", what, timeout);
  return comm;
}

Comm::~Comm() {
  if (!comm_) return;
  // Finalize flushes what is still queued; a communicator that will not settle is aborted.
  ncclResult_t rc = ncclCommFinalize(comm_);
  const auto deadline = deadline_after(kCloseTimeout);
  Backoff backoff;
  while (rc == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
    ncclResult_t state = ncclSuccess;
    rc = ncclCommGetAsyncError(comm_, &state);
    if (rc == ncclSuccess) rc = state;
    if (rc == ncclInProgress) backoff.pause();
  }
  if (rc == ncclSuccess && ncclCommDestroy(comm_) == ncclSuccess) {
    comm_ = nullptr;
    return;
  }
  abort();
}

int Comm::user_rank() const {
  int rank = -1;
  LOCKSTEP_NCCL_CALL(ncclCommUserRank(comm_, &rank));
  return rank;
}

int Comm::count() const {
  int count = 0;
  LOCKSTEP_NCCL_CALL(ncclCommCount(comm_, &count));
  return count;
}

void Comm::abort() noexcept {
  if (!comm_) return;
  ncclCommAbort(comm_);
  comm_ = nullptr;
}

void Comm::fail(const std::string& message) {
  abort();
  throw CommError("nccl backend: " + message);
}

ncclResult_t Comm::settle(const std::string& what, std::chrono::milliseconds timeout) {
  const auto deadline = deadline_after(timeout);
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess) return rc;
    if (state != ncclInProgress) return state;
    if (std::chrono::steady_clock::now() > deadline) fail(timeout_message(what, timeout));
    backoff.pause();
  }
}

void Comm::check(ncclResult_t rc, const char* call, const std::string& what, std::chrono::milliseconds timeout) {
  if (!comm_) throw CommError("nccl backend: " + what + ": the NCCL communicator was aborted by an earlier failure");
  if (rc == ncclInProgress) rc = settle(what + " (" + call + ")", timeout);
  if (rc == ncclSuccess) return;
  std::string message = what + ": " + call + " failed: " + ncclGetErrorString(rc);
  const char* last = ncclGetLastError(comm_);
  if (last && *last) message += std::string(" (") + last + ")";
  fail(message);
}

void Comm::wait(cudaStream_t stream, const std::string& what, std::chrono::milliseconds timeout) {
  if (!comm_) throw CommError("nccl backend: " + what + ": the NCCL communicator was aborted by an earlier failure");
  const auto deadline = deadline_after(timeout);
  Backoff backoff;
  for (;;) {
    const cudaError_t done = cudaStreamQuery(stream);
    if (done == cudaSuccess) return;
    if (done != cudaErrorNotReady) {
      cudaGetLastError();
      fail(what + ": CUDA reported " + cudaGetErrorName(done) + ": " + cudaGetErrorString(done));
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      const ncclResult_t reason = rc != ncclSuccess ? rc : state;
      const char* last = ncclGetLastError(comm_);
      fail(what + ": NCCL reported " + ncclGetErrorString(reason) +
           (last && *last ? std::string(" (") + last + ")" : std::string()) + "; a peer rank may have failed or left");
    }
    if (std::chrono::steady_clock::now() > deadline) fail(timeout_message(what, timeout));
    backoff.pause();
  }
}

// ---- Stream, DeviceBuffer, PinnedBuffer ----

Stream::Stream() {
  LOCKSTEP_CUDA_CALL(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  cudaError_t rc = cudaEventCreateWithFlags(&default_done_, cudaEventDisableTiming);
  if (rc == cudaSuccess) rc = cudaEventCreateWithFlags(&ops_done_, cudaEventDisableTiming);
  if (rc != cudaSuccess) {
    if (default_done_) cudaEventDestroy(default_done_);
    cudaStreamDestroy(stream_);
    check_cuda(rc, "cudaEventCreateWithFlags(..., cudaEventDisableTiming)");
  }
}

Stream::~Stream() {
  cudaEventDestroy(ops_done_);
  cudaEventDestroy(default_done_);
  cudaStreamDestroy(stream_);  // returns at once; the stream's last work still completes
}

void Stream::follow_producers(int device) {
  // The legacy default stream waits for every blocking stream, so this also covers
  // producers on streams created without cudaStreamNonBlocking.
  LOCKSTEP_CUDA_CALL(cudaEventRecord(default_done_, cudaStreamLegacy));
  LOCKSTEP_CUDA_CALL(cudaStreamWaitEvent(stream_, default_done_, 0));
  LOCKSTEP_CUDA_CALL(cudaEventRecord(ops_done_, lockstep::cuda::stream(Device(DeviceType::cuda, device))));
  LOCKSTEP_CUDA_CALL(cudaStreamWaitEvent(stream_, ops_done_, 0));
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFreeAsync(data_, stream_);
}

char* DeviceBuffer::reserve(size_t bytes) {
  if (bytes > bytes_) {
    if (data_) {
      LOCKSTEP_CUDA_CALL(cudaFreeAsync(data_, stream_));
      data_ = nullptr;
      bytes_ = 0;
    }
    const size_t rounded = (bytes + kDeviceGranule - 1) / kDeviceGranule * kDeviceGranule;
    LOCKSTEP_CUDA_CALL(cudaMallocAsync(&data_, rounded, stream_));
    bytes_ = rounded;
  }
  return static_cast<char*>(data_);
}

PinnedBuffer::PinnedBuffer(size_t bytes) { LOCKSTEP_CUDA_CALL(cudaMallocHost(&data_, bytes)); }

PinnedBuffer::~PinnedBuffer() { cudaFreeHost(data_); }

}  // namespace lockstep::comm::nccl
