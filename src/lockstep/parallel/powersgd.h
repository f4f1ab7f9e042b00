// PowerSGD (Vogels et al., 2019; PyTorch's powerSGD_hook): each gradient matrix M (a
// parameter of two or more dimensions, as rows x the rest) crosses between ranks as two thin
// matrices instead of itself. With Q (cols x r) from the step before:
//   P = sum over ranks of (M + e) Q      all-reduced, then its columns orthonormalized
//   Q = sum over ranks of (M + e)^T P    all-reduced, kept for the next step
//   M ~ P Q^T                            on every rank, the same bits
// where e is the rank's error feedback: what its own input had that the approximation,
// shared out evenly, did not. Vectors (biases) and matrices too small to gain are all-reduced
// as they are, in one call. Every all-reduce folds in the tree's order, so all ranks compute
// one approximation and the replicas stay equal; but the error is each rank's own, so the
// weights depend on the rank count (as in PyTorch), not on hosts or placement.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/nn/module.h"
#include "lockstep/parallel/flat_gradients.h"

namespace lockstep::parallel {

class PowerSgd {
 public:
  // layout: where each parameter lies in the flat gradient. rank: the approximation's rank
  // (>= 1). seed: Q's first values (standard normal), the same on every rank.
  PowerSgd(const FlatGradients& layout, int rank, uint64_t seed);

  // In place: `gradient`, this rank's part of the step's sum over the flat layout, becomes
  // the approximation of every rank's sum (matrices) and the exact sum (the rest). Collective.
  void reduce(const Tensor& gradient, comm::Communicator& comm);

  // Elements one reduce() all-reduces, against the flat gradient's numel.
  int64_t elements_sent() const;
  int compressed_matrices() const { return static_cast<int>(matrices_.size()); }

  // What a checkpoint must keep for an exact resume: Q (the same on every rank) and this
  // rank's error, named "q" and "error"; loaded back by load_state on the same rank.
  NamedTensors state() const;
  void load_state(const NamedTensors& state);

 private:
  struct Matrix {
    int64_t offset = 0, rows = 0, cols = 0;
    int rank = 0;
    int64_t p_at = 0, q_at = 0;  // where its P and Q lie in the packed buffers
  };
  std::vector<Matrix> matrices_;
  std::vector<std::pair<int64_t, int64_t>> plain_;  // [begin, end) of the flat gradient sent whole
  int64_t plain_numel_ = 0;
  Tensor p_, q_;  // every matrix's P (rows x r) and Q (cols x r), packed, row-major
  Tensor error_;  // this rank's error feedback, in the flat layout (matrices only)
  Tensor plain_buffer_;
};

}  // namespace lockstep::parallel
