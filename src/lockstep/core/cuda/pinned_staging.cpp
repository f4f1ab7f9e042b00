#include "lockstep/core/cuda/pinned_staging.h"

#include <cstring>
#include <mutex>
#include <vector>

#include "lockstep/core/cuda/check.h"
#include "lockstep/core/error.h"

namespace lockstep::cuda {
namespace {

struct Block {
  void* data = nullptr;
  size_t bytes = 0;
  cudaEvent_t read = nullptr;  // recorded after the last copy from it; null: never used
  bool taken = false;          // between choosing it and recording its event
};

// The smallest block that fits a size: powers of two from 64 KiB, so a run's batches of one
// shape keep reusing the same few blocks.
size_t block_bytes(size_t bytes) {
  size_t size = size_t{64} << 10;
  while (size < bytes) size *= 2;
  return size;
}

class StagingPool {
 public:
  // A block of at least `bytes` that no queued copy still reads.
  Block* take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Block* b : blocks_) {
      if (b->taken || b->bytes < bytes) continue;
      if (b->read != nullptr) {
        const cudaError_t state = cudaEventQuery(b->read);
        if (state == cudaErrorNotReady) continue;
        LOCKSTEP_CUDA_CHECK(state);
        LOCKSTEP_CUDA_CHECK(cudaEventDestroy(b->read));
        b->read = nullptr;
      }
      b->taken = true;
      return b;
    }
    auto* b = new Block();  // never freed, as the streams are not: copies may be in flight at exit
    b->bytes = block_bytes(bytes);
    LOCKSTEP_CUDA_CHECK(cudaMallocHost(&b->data, b->bytes));
    b->taken = true;
    blocks_.push_back(b);
    return b;
  }

  // The block serves again once the work queued on `stream` so far (its copy) is done. The
  // event is made under the stream's GPU, which must be current: an event records only on a
  // stream of the GPU it was made on.
  void give_back(Block* b, cudaStream_t stream) {
    cudaEvent_t event = nullptr;
    cudaError_t rc = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (rc == cudaSuccess) rc = cudaEventRecord(event, stream);
    std::lock_guard<std::mutex> lock(mutex_);
    if (rc != cudaSuccess) {
      // Without an event the block cannot be known to be free: it stays taken.
      if (event != nullptr) cudaEventDestroy(event);
      LOCKSTEP_CUDA_CHECK(rc);
    }
    b->read = event;
    b->taken = false;
  }

 private:
  std::mutex mutex_;
  std::vector<Block*> blocks_;
};

StagingPool& pool() {
  static auto* p = new StagingPool();  // never freed: copies may be queued when statics go
  return *p;
}

}  // namespace

void copy_to_device_staged(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  LOCKSTEP_CHECK(bytes <= kMaxStagedCopyBytes)
      << "a staged copy holds at most " << kMaxStagedCopyBytes << " bytes, not " << bytes;
  Block* b = pool().take(bytes);
  std::memcpy(b->data, src, bytes);
  const cudaError_t queued = cudaMemcpyAsync(dst, b->data, bytes, cudaMemcpyHostToDevice, stream);
  pool().give_back(b, stream);  // also when the copy failed: its event still completes
  LOCKSTEP_CUDA_CHECK(queued);
}

}  // namespace lockstep::cuda
