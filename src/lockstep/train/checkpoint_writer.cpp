#include "lockstep/train/checkpoint_writer.h"

#include <chrono>
#include <cstdio>

#include "lockstep/core/cuda_device.h"
#include "lockstep/core/storage.h"

namespace lockstep::train {

namespace {

// Where a tensor is copied to at the step boundary: host memory, page-locked for a GPU's
// tensor so the copy runs at the bus's speed (and the step is held for less).
Tensor host_buffer_for(const Tensor& tensor) {
  if (!tensor.device().is_cuda()) return Tensor::empty(tensor.shape(), tensor.dtype());
  const size_t bytes = tensor.nbytes();
  auto storage = std::make_shared<Storage>(Device::cpu(), bytes, cuda::allocate_pinned_host(bytes),
                                           [](void* ptr) { cuda::release_pinned_host(ptr); });
  return Tensor::from_storage(std::move(storage), tensor.shape(), tensor.dtype());
}

bool same_layout(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || a[i].second.shape() != b[i].second.shape() ||
        a[i].second.dtype() != b[i].second.dtype())
      return false;
  }
  return true;
}

}  // namespace

CheckpointWriter::CheckpointWriter(CheckpointFolder folder) : folder_(std::move(folder)) {}

CheckpointWriter::~CheckpointWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep: %s\n", e.what());
  }
}

void CheckpointWriter::write(int64_t step, const NamedTensors& tensors, Metadata metadata) {
  wait();
  if (!same_layout(copies_, tensors)) {
    copies_.clear();
    for (const auto& [name, tensor] : tensors) copies_.emplace_back(name, host_buffer_for(tensor));
  }
  for (size_t i = 0; i < tensors.size(); ++i) copies_[i].second.copy_from(tensors[i].second);
  in_flight_ = std::async(std::launch::async, [this, step, metadata = std::move(metadata)] {
    const auto start = std::chrono::steady_clock::now();
    folder_.save(step, copies_, metadata);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
}

void CheckpointWriter::wait() {
  if (!in_flight_.valid()) return;
  seconds_ += in_flight_.get();  // get() leaves the future invalid, also when it throws
  ++writes_;
}

}  // namespace lockstep::train
