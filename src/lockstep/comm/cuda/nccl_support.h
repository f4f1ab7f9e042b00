// What the nccl backend needs around raw CUDA and NCCL: return codes turned into
// CommError, a communicator handle that waits with a timeout and aborts instead of
// hanging (so a dead rank cannot hang the others), streams, and device and pinned buffers.
// Included only by the backend's .cpp files: it pulls in cuda_runtime.h and nccl.h.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "lockstep/comm/communicator.h"
#include "lockstep/comm/reduce_op.h"
#include "lockstep/core/dtype.h"

// Non-blocking communicators (abortable init and waits), ncclCommFinalize and
// ncclGetLastError arrived in NCCL 2.14; ncclAvg and bf16 in 2.10.
static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0), "the nccl backend needs NCCL 2.14 or newer");

// Throws CommError naming the call and CUDA's or NCCL's reason.
#define LOCKSTEP_CUDA_CALL(call) ::lockstep::comm::nccl::check_cuda((call), #call)
#define LOCKSTEP_NCCL_CALL(call) ::lockstep::comm::nccl::check_nccl((call), #call)

namespace lockstep::comm::nccl {

void check_cuda(cudaError_t rc, const char* call);
void check_nccl(ncclResult_t rc, const char* call);

ncclDataType_t nccl_dtype(DType dtype);
ncclRedOp_t nccl_op(ReduceOp op);

// A unique id travels through the Store as text.
std::string to_hex(const ncclUniqueId& id);
ncclUniqueId from_hex(const std::string& text, const std::string& key);

// Makes device the calling thread's current CUDA device for a scope: every lane's thread
// (the caller's, or a worker's) must target the communicator's GPU, and the caller's own
// choice is put back afterwards (if this process has used that GPU: cuda::gpu_used).
class CurrentDevice {
 public:
  explicit CurrentDevice(int device);
  ~CurrentDevice();
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = -1;
};

// One NCCL communicator, non-blocking so that every wait can give up: a wait that passes
// its deadline, or an error NCCL reports asynchronously, aborts it (its kernels stop) and
// throws CommError. Once aborted it stays unusable; the destructor then only frees it.
class Comm {
 public:
  // Joins the communicator of id as rank of nranks, waiting up to timeout for the others.
  // what names it in errors ("rendezvous of the nccl backend (job/world)").
  static std::unique_ptr<Comm> init(const ncclUniqueId& id, int nranks, int rank, std::chrono::milliseconds timeout,
                                    const std::string& what);
  // Adopts a communicator NCCL created (ncclCommSplit), waiting until it is ready.
  static std::unique_ptr<Comm> adopt(ncclComm_t comm, std::chrono::milliseconds timeout, const std::string& what);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  ncclComm_t get() const { return comm_; }
  int user_rank() const;
  int count() const;

  // The result of an NCCL call on this communicator: ncclInProgress (the call is still being
  // queued) is waited out; a failure aborts and throws CommError naming call and what.
  void check(ncclResult_t rc, const char* call, const std::string& what, std::chrono::milliseconds timeout);
  // Waits until all work queued on stream has run, polling CUDA and NCCL; on a CUDA or NCCL
  // error or after timeout, aborts and throws CommError naming what.
  void wait(cudaStream_t stream, const std::string& what, std::chrono::milliseconds timeout);
  // Stops this communicator's kernels and frees it; idempotent, never throws.
  void abort() noexcept;
  bool aborted() const { return comm_ == nullptr; }

 private:
  explicit Comm(ncclComm_t comm) : comm_(comm) {}
  // Polls the asynchronous state until it leaves ncclInProgress; returns it.
  ncclResult_t settle(const std::string& what, std::chrono::milliseconds timeout);
  [[noreturn]] void fail(const std::string& message);

  ncclComm_t comm_ = nullptr;
};

// A stream of one lane, created non-blocking so it never waits on (or holds up) the legacy
// default stream by accident; follow_producers() orders it after the work queued so far on
// the legacy default stream and on the stream of the tensors' device (where Lockstep's ops
// run), which is how the tensors' producers are waited for.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void follow_producers(int device);

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t default_done_ = nullptr;
  cudaEvent_t ops_done_ = nullptr;
};

// Says that this process runs an NCCL rank on GPU gpu (a CUDA device ordinal); the
// communicator's rendezvous calls it before ncclCommInitRankConfig, so every GPU of a
// communicator's ranks in this process is known before any of them can move data.
void register_rank_gpu(int gpu);

// The stream-ordered memory pool of GPU gpu for NCCL's buffers, readable and writable by the
// GPUs of this process's other NCCL ranks (register_rank_gpu) that can reach gpu peer to peer.
// When ranks share a process, NCCL (2.14 to 2.22 at least) has the peer GPU read and write the
// buffers passed to it directly ("P2P/direct pointer"). Peer access (cudaDeviceEnablePeerAccess,
// which NCCL turns on) covers cudaMalloc's memory, the caching allocator's tensors, but not
// a pool's: cudaMallocAsync's memory is the peer's only after cudaMemPoolSetAccess. Access
// is granted to peers that joined since the last call, for the pool's every allocation, and
// only to GPUs the process uses (granting it to another would create a context there). A
// pool of its own, so the device's default pool stays private.
cudaMemPool_t peer_visible_pool(int gpu);

// Device memory on GPU gpu for NCCL to read and write (from peer_visible_pool) that grows on
// demand, allocated and freed in the order of one stream (cudaMallocFromPoolAsync): cudaMalloc/
// cudaFree could synchronize the device and so wait on another lane's NCCL kernel that is
// itself waiting for a peer.
class DeviceBuffer {
 public:
  DeviceBuffer(int gpu, cudaStream_t stream) : gpu_(gpu), stream_(stream) {}
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // At least bytes of memory, usable by work queued on the stream from now on, and by the
  // GPUs of the process's other ranks. Earlier contents are lost when it grows.
  char* reserve(size_t bytes);

 private:
  int gpu_;
  cudaStream_t stream_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// NCCL's version codes: major·10000 + minor·100 + patch from 2.9 on, major·1000 + minor·100 +
// patch before. version_text(21803) is "2.18.3"; version_at_least compares two codes of
// either form.
std::string version_text(int code);
bool version_at_least(int code, int minimum);

// The oldest NCCL library this build runs with: 2.14 (non-blocking communicators,
// ncclCommFinalize, ncclGetLastError), or 2.18 where the headers it was built against had
// ncclCommSplit, which split() then calls.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
inline constexpr int kMinimumRuntimeVersion = NCCL_VERSION(2, 18, 0);
#else
inline constexpr int kMinimumRuntimeVersion = NCCL_VERSION(2, 14, 0);
#endif

// Empty when the library's version (ncclGetVersion's code) is at least minimum; else the
// error, naming both versions, the headers' (NCCL_VERSION_CODE), the library's file and the
// fixes.
std::string runtime_version_problem(int runtime, int minimum, int headers, const std::string& library);
// Throws CommError when the NCCL library this process loaded is older than
// kMinimumRuntimeVersion: the library may be another installation's than the headers were
// (libnccl.so.2 names every 2.x), and a missing function would fail at its first call.
void check_runtime_version();

// Page-locked host memory, so copies of small control blocks (call descriptions, message
// headers) are truly asynchronous and ordered on the stream.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  char* get() const { return static_cast<char*>(data_); }

 private:
  void* data_ = nullptr;
};

}  // namespace lockstep::comm::nccl
