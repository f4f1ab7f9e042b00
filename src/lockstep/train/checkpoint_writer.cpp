#include "lockstep/train/checkpoint_writer.h"

#include <chrono>
#include <cstdio>

namespace lockstep::train {

namespace {

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
    for (const auto& [name, tensor] : tensors)
      copies_.emplace_back(name, Tensor::empty(tensor.shape(), tensor.dtype()));
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
