#include "lockstep/nn/embedding.h"

#include "lockstep/nn/init.h"
#include "lockstep/ops/embedding.h"

namespace lockstep::nn {

Embedding::Embedding(int64_t num, int64_t dim) : Module("Embedding"), num_embeddings(num), embedding_dim(dim) {
  LOCKSTEP_CHECK(num > 0 && dim > 0) << "Embedding(" << num << ", " << dim << "): sizes must be positive";
  weight = register_parameter("weight", Tensor::zeros({num, dim}));
  initialize(*this, 0);
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(indices, weight); }

void Embedding::reset_parameter(const std::string&, const Tensor& parameter, Philox& rng) {
  init::normal_(parameter, 0.0, 1.0, rng);
}

}  // namespace lockstep::nn
