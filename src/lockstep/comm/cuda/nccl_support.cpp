#include "lockstep/comm/cuda/nccl_support.h"

#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
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

// ---- versions ----

namespace {

struct Version {
  int major, minor, patch;
};

Version version_of(int code) {
  if (code >= 10000) return {code / 10000, code % 10000 / 100, code % 100};
  return {code / 1000, code % 1000 / 100, code % 100};
}

}  // namespace

std::string version_text(int code) {
  const Version v = version_of(code);
  return std::to_string(v.major) + "." + std::to_string(v.minor) + "." + std::to_string(v.patch);
}

bool version_at_least(int code, int minimum) {
  const Version v = version_of(code), m = version_of(minimum);
  if (v.major != m.major) return v.major > m.major;
  if (v.minor != m.minor) return v.minor > m.minor;
  return v.patch >= m.patch;
}

std::string runtime_version_problem(int runtime, int minimum, int headers, const std::string& library) {
  if (version_at_least(runtime, minimum)) return {};
  const Version need = version_of(minimum);
  return "nccl backend: the NCCL library this process loaded (" + library + ") is version " + version_text(runtime) +
         ", older than " + version_text(minimum) + ", the oldest this build of Lockstep runs with (it was compiled " +
         "against NCCL " + version_text(headers) + "'s headers). Make a libnccl.so.2 of NCCL " +
         std::to_string(need.major) + "." + std::to_string(need.minor) +
         " or newer the one that loads (LD_LIBRARY_PATH; `ldd` on the program shows which loads), or rebuild " +
         "Lockstep against the NCCL that is installed (NCCL_HOME)";
}

void check_runtime_version() {
  int runtime = 0;
  LOCKSTEP_NCCL_CALL(ncclGetVersion(&runtime));
  std::string library = "linked statically";
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) != 0 && info.dli_fname != nullptr) {
    library = info.dli_fname;
  }
  const std::string problem = runtime_version_problem(runtime, kMinimumRuntimeVersion, NCCL_VERSION_CODE, library);
  if (!problem.empty()) throw CommError(problem);
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

namespace {

// The GPUs of this process's NCCL ranks, and each GPU's pool with the peers it was opened to.
// Never freed: buffers are freed into the pools until the process ends.
struct PeerPools {
  struct Pool {
    cudaMemPool_t pool = nullptr;
    std::set<int> granted;  // the GPUs considered so far (granted access, or unable to reach it)
  };
  std::mutex mutex;
  std::set<int> rank_gpus;
  std::map<int, Pool> pools;
};

PeerPools& peer_pools() {
  static auto* pools = new PeerPools();
  return *pools;
}

}  // namespace

void register_rank_gpu(int gpu) {
  PeerPools& p = peer_pools();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.rank_gpus.insert(gpu);
}

cudaMemPool_t peer_visible_pool(int gpu) {
  PeerPools& p = peer_pools();
  std::lock_guard<std::mutex> lock(p.mutex);
  PeerPools::Pool& entry = p.pools[gpu];
  if (entry.pool == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = gpu;
    LOCKSTEP_CUDA_CALL(cudaMemPoolCreate(&entry.pool, &props));
    entry.granted.insert(gpu);  // the pool's own GPU has access from the start
  }
  for (int peer : p.rank_gpus) {
    if (entry.granted.count(peer) != 0) continue;
    int can = 0;
    LOCKSTEP_CUDA_CALL(cudaDeviceCanAccessPeer(&can, peer, gpu));
    // Without peer-to-peer access NCCL does not use direct pointers between the two GPUs.
    if (can) {
      cudaMemAccessDesc access{};
      access.location.type = cudaMemLocationTypeDevice;
      access.location.id = peer;
      access.flags = cudaMemAccessFlagsProtReadWrite;
      const cudaError_t rc = cudaMemPoolSetAccess(entry.pool, &access, 1);
      if (rc != cudaSuccess) {
        cudaGetLastError();
        throw CommError("nccl backend: cudaMemPoolSetAccess could not open GPU " + std::to_string(gpu) +
                        "'s buffers for NCCL to GPU " + std::to_string(peer) +
                        ", which runs another rank of this process: " + cudaGetErrorName(rc) + ": " +
                        cudaGetErrorString(rc) + "; run one rank per process (lockstep run) instead");
      }
    }
    entry.granted.insert(peer);
  }
  return entry.pool;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFreeAsync(data_, stream_);
}

char* DeviceBuffer::reserve(size_t bytes) {
  // Every use of the buffer reserves it first: a rank that joined the process since the
  // last call is granted access before the memory is handed to NCCL again.
  cudaMemPool_t pool = peer_visible_pool(gpu_);
  if (bytes > bytes_) {
    if (data_) {
      LOCKSTEP_CUDA_CALL(cudaFreeAsync(data_, stream_));
      data_ = nullptr;
      bytes_ = 0;
    }
    const size_t rounded = (bytes + kDeviceGranule - 1) / kDeviceGranule * kDeviceGranule;
    LOCKSTEP_CUDA_CALL(cudaMallocFromPoolAsync(&data_, rounded, pool, stream_));
    bytes_ = rounded;
  }
  return static_cast<char*>(data_);
}

PinnedBuffer::PinnedBuffer(size_t bytes) { LOCKSTEP_CUDA_CALL(cudaMallocHost(&data_, bytes)); }

PinnedBuffer::~PinnedBuffer() { cudaFreeHost(data_); }

}  // namespace lockstep::comm::nccl
