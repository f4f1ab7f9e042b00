// Embedding: a gather of weight rows. Backward scatter-adds the output gradient rows into
// the weight gradient in index order, so a row picked several times sums the same way on
// every run and every thread count (threads split the embedding columns, not the indices).
#include "lockstep/ops/embedding.h"

#include <algorithm>
#include <vector>

#include "lockstep/autograd/node.h"
#include "lockstep/core/parallel.h"
#include "lockstep/ops/dispatch.h"

namespace lockstep {
namespace {

// The indices as int64, each checked against [0, vocab).
std::vector<int64_t> checked_indices(const Tensor& indices, int64_t vocab) {
  LOCKSTEP_CHECK(indices.dtype() == DType::i64 || indices.dtype() == DType::i32)
      << "embedding: indices must be i64 or i32, got " << dtype_name(indices.dtype());
  std::vector<int64_t> out = indices.to_vector<int64_t>();
  for (size_t i = 0; i < out.size(); ++i) {
    LOCKSTEP_CHECK(out[i] >= 0 && out[i] < vocab)
        << "embedding: index " << out[i] << " (at flat position " << i << " of indices " << shape_str(indices.shape())
        << ") is outside [0, V) with V = " << vocab;
  }
  return out;
}

}  // namespace

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  const Device device = ops::common_device("embedding", {indices, weight});
  ops::require_cpu("embedding", device);
  ops::require_float("embedding", weight);
  LOCKSTEP_CHECK(weight.dim() == 2) << "embedding: weight must be [V, D], got shape " << shape_str(weight.shape());
  const int64_t vocab = weight.size(0), dim = weight.size(1);
  const std::vector<int64_t> rows = checked_indices(indices, vocab);
  const int64_t count = static_cast<int64_t>(rows.size());
  const Tensor w = weight.contiguous();

  Shape out_shape = indices.shape();
  out_shape.push_back(dim);
  Tensor out = Tensor::empty(out_shape, weight.dtype(), device);
  ops::dispatch_float("embedding", weight.dtype(), [&]<typename T>() {
    const T* src = w.data<T>();
    T* dst = out.data<T>();
    parallel_for(count, std::max<int64_t>(1, 16384 / std::max<int64_t>(dim, 1)), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) std::copy_n(src + rows[static_cast<size_t>(i)] * dim, dim, dst + i * dim);
    });
  });

  autograd::record("EmbeddingBackward", {w}, {out}, [rows, vocab, dim, count](const std::vector<Tensor>& g) {
    const Tensor grad = g[0].contiguous();
    Tensor grad_w = Tensor::zeros({vocab, dim}, grad.dtype(), grad.device());
    ops::dispatch_float("embedding", grad.dtype(), [&]<typename T>() {
      const T* src = grad.data<T>();
      T* dst = grad_w.data<T>();
      parallel_for(dim, std::max<int64_t>(1, 16384 / std::max<int64_t>(count, 1)), [&](int64_t begin, int64_t end) {
        for (int64_t i = 0; i < count; ++i) {
          T* row = dst + rows[static_cast<size_t>(i)] * dim;
          const T* g_row = src + i * dim;
          for (int64_t d = begin; d < end; ++d) row[d] += g_row[d];
        }
      });
    });
    return std::vector<Tensor>{grad_w};
  });
  return out;
}

}  // namespace lockstep
