// A tensor where a backend can move it. Each backend moves one kind of memory: host memory
// (`local`, `shm`, `mpi`) or its GPU's (`nccl`). A tensor given to it in the other kind
// travels through a copy there and, for what the call writes, back: so every communicator
// takes tensors on any device — a GPU model's activations over `local` threads whose devices
// share one GPU, a step's host-side flag or loss over `nccl` — and the caller never asks
// which backend it has. The copies are what makes it work, not what makes it fast: a GPU
// job's hot collectives go over nccl on the tensors' own GPUs, with nothing to stage.
#pragma once

#include "lockstep/core/tensor.h"

namespace lockstep::comm {

class StagedTensor {
 public:
  // `tensor` as the backend whose memory is `memory` sees it: itself when it is there
  // already, else a copy of it (reads: the call reads its values) or an empty tensor of
  // its shape (the call only writes it).
  StagedTensor(const Tensor& tensor, Device memory, bool reads);

  const Tensor& get() const { return staged_; }
  // What the call wrote into the staged copy, copied into the tensor given; nothing when
  // that was the tensor itself.
  void write_back() const;

 private:
  Tensor given_, staged_;
};

}  // namespace lockstep::comm
