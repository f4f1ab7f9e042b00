// What one NcclCommunicator holds (streams, buffers, NCCL communicators), shared by the
// backend's source files: nccl_communicator.cpp (collectives) and nccl_communicator_p2p.cpp
// (send/recv). Private to the backend.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "lockstep/comm/cuda/nccl_communicator.h"
#include "lockstep/comm/cuda/nccl_support.h"
#include "lockstep/core/cuda/runtime.h"

namespace lockstep::comm {

namespace nccl {

// Bytes of one rank's call description (WireDesc) and of a message header (P2pHeader).
constexpr size_t kDescBytes = 40;
constexpr size_t kHeaderBytes = 24;

// The device address of a tensor's first element (Tensor::raw_data() is for host memory).
inline char* device_pointer(const Tensor& t) {
  return static_cast<char*>(t.storage()->data()) + t.offset() * static_cast<int64_t>(dtype_size(t.dtype()));
}

inline Device cuda_device(int index) { return Device(DeviceType::cuda, index); }

inline void copy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  if (bytes > 0) LOCKSTEP_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, kind, stream));
}

}  // namespace nccl

struct NcclCommunicator::State {
  // Streams and buffers on the current CUDA device, which must be `device`.
  State(std::shared_ptr<Store> store_, std::string prefix_, int device_, bool deterministic_, int size)
      : store(std::move(store_)),
        prefix(std::move(prefix_)),
        device(device_),
        deterministic(deterministic_),
        descs(static_cast<size_t>(size) * nccl::kDescBytes) {
    control.reserve(static_cast<size_t>(size) * nccl::kDescBytes + sizeof(int64_t));
    send_header.reserve(nccl::kHeaderBytes);
    recv_header.reserve(nccl::kHeaderBytes);
  }

  // The two-rank communicator that carries messages between this rank and peer in one
  // direction, made at the first message (nccl_communicator_p2p.cpp).
  nccl::Comm& pair(int me, int peer, bool sending, std::chrono::milliseconds timeout, const std::string& what);

  std::shared_ptr<Store> store;  // for the point-to-point communicators and splits
  std::string prefix;            // this communicator's keys in the store
  int device;
  bool deterministic;

  // One stream per lane. Declared first so they go last, after the buffers freed on them.
  nccl::Stream collectives;
  nccl::Stream sends;
  nccl::Stream receives;

  // The collectives lane: every rank's call description, then the barrier's word (device);
  // the descriptions' host copy; scratch for deterministic folds and staging copies.
  nccl::DeviceBuffer control{device, collectives.get()};
  nccl::PinnedBuffer descs;
  nccl::DeviceBuffer scratch{device, collectives.get()};
  nccl::DeviceBuffer staging{device, collectives.get()};

  // The point-to-point lanes' message headers, and where a mismatched message is drained.
  nccl::DeviceBuffer send_header{device, sends.get()};
  nccl::PinnedBuffer send_header_host{nccl::kHeaderBytes};
  nccl::DeviceBuffer recv_header{device, receives.get()};
  nccl::PinnedBuffer recv_header_host{nccl::kHeaderBytes};
  nccl::DeviceBuffer drain{device, receives.get()};

  // Communicators, declared last so they are closed first.
  std::unique_ptr<nccl::Comm> world;  // used by the collectives lane only
  std::mutex p2p_mutex;               // guards the two maps
  std::map<int, std::unique_ptr<nccl::Comm>> to_peer;
  std::map<int, std::unique_ptr<nccl::Comm>> from_peer;
};

}  // namespace lockstep::comm
