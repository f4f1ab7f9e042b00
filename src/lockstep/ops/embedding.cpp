// Embedding: a gather of weight rows. Backward scatter-adds the output gradient rows into
// the weight gradient in index order, so a row picked several times sums the same way on
// every run and every thread count (threads split the embedding columns, not the indices).
// On a GPU (ops/cuda/embedding_kernels) the indices stay on the device: the gather checks
// them, and backward groups the tokens by row with a stable sort, keeping the same order.
#include "lockstep/ops/embedding.h"

#include <algorithm>
#include <vector>

#include "lockstep/autograd/node.h"
#include "lockstep/core/parallel.h"
#include "lockstep/ops/dispatch.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/ops/cuda/embedding_kernels.h"
#endif

namespace lockstep {
namespace {

void check_index_dtype(const Tensor& indices) {
  LOCKSTEP_CHECK(indices.dtype() == DType::i64 || indices.dtype() == DType::i32)
      << "embedding: indices must be i64 or i32, got " << dtype_name(indices.dtype());
}

// The indices as int64, each checked against [0, vocab).
std::vector<int64_t> checked_indices(const Tensor& indices, int64_t vocab) {
  check_index_dtype(indices);
  std::vector<int64_t> out = indices.to_vector<int64_t>();
  for (size_t i = 0; i < out.size(); ++i) {
    LOCKSTEP_CHECK(out[i] >= 0 && out[i] < vocab)
        << "embedding: index " << out[i] << " (at flat position " << i << " of indices " << shape_str(indices.shape())
        << ") is outside [0, V) with V = " << vocab;
  }
  return out;
}

#if LOCKSTEP_HAVE_CUDA
Tensor embedding_cuda(const Tensor& indices, const Tensor& weight) {
  check_index_dtype(indices);
  const Device device = weight.device();
  const int64_t vocab = weight.size(0), dim = weight.size(1);
  const Tensor ic = indices.contiguous();
  const int64_t count = ic.numel();
  const Tensor w = weight.contiguous();

  Shape out_shape = indices.shape();
  out_shape.push_back(dim);
  Tensor out = Tensor::empty(out_shape, weight.dtype(), device);
  const Tensor first_bad = Tensor::empty({1}, DType::i64, device);
  {
    lockstep::cuda::OnDevice on(device);
    ops::dispatch_float("embedding", weight.dtype(), [&]<typename T>() {
      ops::dispatch_index("embedding", ic.dtype(), [&]<typename I>() {
        ops::cuda::embedding_forward<T, I>(ic.data_ptr<I>(), count, w.data_ptr<T>(), vocab, dim, out.data_ptr<T>(),
                                           first_bad.data_ptr<int64_t>(), on.stream());
      });
    });
  }
  // Reading the flag back waits for the gather, which recorded the first bad position.
  const int64_t bad = first_bad.to_vector<int64_t>()[0];
  LOCKSTEP_CHECK(bad < 0) << "embedding: index " << ic.as_strided({1}, {1}, ic.offset() + bad).to_vector<int64_t>()[0]
                          << " (at flat position " << bad << " of indices " << shape_str(indices.shape())
                          << ") is outside [0, V) with V = " << vocab;

  autograd::record("EmbeddingBackward", {w}, {out}, [ic, vocab, dim, count](const std::vector<Tensor>& g) {
    const Tensor grad = g[0].contiguous();
    Tensor grad_w = Tensor::zeros({vocab, dim}, grad.dtype(), grad.device());
    if (count == 0 || dim == 0) return std::vector<Tensor>{grad_w};
    lockstep::cuda::OnDevice on(grad.device());
    ops::dispatch_float("embedding", grad.dtype(), [&]<typename T>() {
      ops::dispatch_index("embedding", ic.dtype(), [&]<typename I>() {
        const size_t bytes = ops::cuda::embedding_backward_scratch_bytes<I>(count, vocab);
        const Tensor scratch = Tensor::empty({static_cast<int64_t>(bytes)}, DType::u8, grad.device());
        ops::cuda::embedding_backward<T, I>(ic.data_ptr<I>(), count, grad.data_ptr<T>(), vocab, dim,
                                            grad_w.data_ptr<T>(), scratch.data_ptr(), bytes, on.stream());
      });
    });
    return std::vector<Tensor>{grad_w};
  });
  return out;
}
#endif

}  // namespace

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  const Device device = ops::common_device("embedding", {indices, weight});
  ops::require_device("embedding", device);
  ops::require_float("embedding", weight);
  LOCKSTEP_CHECK(weight.dim() == 2) << "embedding: weight must be [V, D], got shape " << shape_str(weight.shape());
#if LOCKSTEP_HAVE_CUDA
  if (device.is_cuda()) return embedding_cuda(indices, weight);
#endif
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
