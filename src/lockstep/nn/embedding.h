// Embedding table as a layer (torch.nn.Embedding): forward takes integer indices (i64 or
// i32) and returns their rows; weight [num_embeddings, dim] initialized N(0, 1).
#pragma once

#include "lockstep/nn/module.h"

namespace lockstep::nn {

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& indices) override;
  void reset_parameter(const std::string& name, const Tensor& parameter, Philox& rng) override;

  const int64_t num_embeddings, embedding_dim;
  Tensor weight;  // [num_embeddings, embedding_dim]
};

}  // namespace lockstep::nn
