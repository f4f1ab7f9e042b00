// The vocabulary cut across a tensor-parallel group (Megatron-LM): rank r holds rows
// [r·V/T, (r+1)·V/T) of the token embedding, and with a tied head computes only those
// columns of the logits. Neither the whole table nor the whole logits live on one rank.
#pragma once

#include <memory>

#include "lockstep/comm/communicator.h"
#include "lockstep/nn/module.h"

namespace lockstep::parallel {

// Rows [first, first + V/T) of a full [V, D] table. Forward looks up the tokens this rank
// holds, zeros for the others, and all-reduces: every rank gets the full embedding.
class VocabParallelEmbedding : public nn::Module {
 public:
  VocabParallelEmbedding(const Tensor& full_weight, std::shared_ptr<comm::Communicator> group);
  Tensor forward(const Tensor& tokens) override;  // [..] integer tokens -> [.., D]

  const int64_t vocab, first;  // the whole vocabulary; this rank's first row
  Tensor weight;               // [V/T, D]

 private:
  std::shared_ptr<comm::Communicator> group_;
};

// Cross-entropy per row from logits cut by vocabulary: `logits` [N, V/T] are this rank's
// columns [first, first + V/T) of the full [N, V]; targets [N] index the full vocabulary.
// Returns the [N] losses, the same on every rank, computed with three all-reduces of N
// numbers (the row maxima, the sums of exponentials, the target logits) instead of
// gathering [N, V]. Backward gives this rank's columns of softmax − one-hot.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t first,
                                    const std::shared_ptr<comm::Communicator>& group);

}  // namespace lockstep::parallel
