#include "lockstep/parallel/vocab_parallel.h"

#include <cmath>
#include <limits>

#include "lockstep/autograd/node.h"
#include "lockstep/ops/ops.h"
#include "lockstep/parallel/tensor_parallel.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/parallel/cuda/vocab_parallel_kernels.h"
#endif

namespace lockstep::parallel {
namespace {

#if LOCKSTEP_HAVE_CUDA
// The CPU path's steps as GPU kernels, the same three all-reduces between them.
Tensor cross_entropy_on_gpu(const Tensor& x, const Tensor& target, int64_t first,
                            const std::shared_ptr<comm::Communicator>& group) {
  const int64_t n = x.size(0), columns = x.size(1);
  const Device device = x.device();
  const Tensor max = Tensor::empty({n}, DType::f32, device), sums = Tensor::empty({n}, DType::f32, device),
               picked = Tensor::empty({n}, DType::f32, device), loss = Tensor::empty({n}, DType::f32, device),
               probabilities = Tensor::empty({n, columns}, DType::f32, device);
  {
    const lockstep::cuda::OnDevice on(device);
    cuda::vocab_row_max(x.data_ptr<float>(), n, columns, max.data_ptr<float>(), on.stream());
  }
  group->all_reduce(max, comm::ReduceOp::max);
  {
    const lockstep::cuda::OnDevice on(device);
    cuda::vocab_exp_sums(x.data_ptr<float>(), target.data_ptr<int64_t>(), n, columns, first, max.data_ptr<float>(),
                         probabilities.data_ptr<float>(), sums.data_ptr<float>(), picked.data_ptr<float>(),
                         on.stream());
  }
  group->all_reduce(sums);
  group->all_reduce(picked);
  {
    const lockstep::cuda::OnDevice on(device);
    cuda::vocab_losses(probabilities.data_ptr<float>(), sums.data_ptr<float>(), picked.data_ptr<float>(), n, columns,
                       loss.data_ptr<float>(), on.stream());
  }
  autograd::record("vocab_parallel_cross_entropy", {x}, {loss},
                   [probabilities, target, first](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
                     const Device device = probabilities.device();
                     const Tensor g = Tensor::empty(probabilities.shape(), DType::f32, device);
                     const Tensor upstream = grads[0].contiguous().to(DType::f32);
                     const lockstep::cuda::OnDevice on(device);
                     cuda::vocab_gradient(probabilities.data_ptr<float>(), target.data_ptr<int64_t>(),
                                          upstream.data_ptr<float>(), probabilities.size(0), probabilities.size(1),
                                          first, g.data_ptr<float>(), on.stream());
                     return {g};
                   });
  return loss;
}
#endif

}  // namespace

VocabParallelEmbedding::VocabParallelEmbedding(const Tensor& full_weight, std::shared_ptr<comm::Communicator> group)
    : Module("VocabParallelEmbedding"),
      vocab(full_weight.size(0)),
      first(full_weight.size(0) / group->size() * group->rank()),
      group_(std::move(group)) {
  LOCKSTEP_CHECK(vocab % group_->size() == 0)
      << "VocabParallelEmbedding: a vocabulary of " << vocab << " does not cut into " << group_->size()
      << " equal shards; use a tensor-parallel size that divides it";
  NoGradGuard no_grad;
  const int64_t rows = vocab / group_->size();
  weight = register_parameter("weight", slice(full_weight, 0, first, first + rows).contiguous().clone());
  weight.set_requires_grad(true);
}

Tensor VocabParallelEmbedding::forward(const Tensor& tokens) {
  // Tokens another rank holds look up row 0 here and are zeroed by the mask, both made on
  // the host (a GPU's tokens are read back: the lookup would wait for them anyway, to check
  // them) and used where the tokens are.
  Tensor all = tokens.contiguous().to(DType::i64);
  if (all.device().is_cuda()) all = all.to(Device::cpu());
  const int64_t rows = weight.size(0);
  std::vector<int64_t> local(static_cast<size_t>(all.numel()));
  std::vector<double> mine(local.size());
  const int64_t* t = all.data<int64_t>();
  for (size_t i = 0; i < local.size(); ++i) {
    LOCKSTEP_CHECK(t[i] >= 0 && t[i] < vocab)
        << "VocabParallelEmbedding: token " << t[i] << " is outside [0, " << vocab << ")";
    mine[i] = t[i] >= first && t[i] < first + rows ? 1.0 : 0.0;
    local[i] = mine[i] != 0 ? t[i] - first : 0;
  }
  const Tensor mask = Tensor::from_vector(mine, all.shape(), tokens.device()).to(weight.dtype());
  const Tensor rows_here =
      embedding(Tensor::from_vector(local, all.shape(), tokens.device()), weight) * unsqueeze(mask, mask.dim());
  return reduce_from_tensor_parallel(rows_here, group_);
}

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t first,
                                    const std::shared_ptr<comm::Communicator>& group) {
  LOCKSTEP_CHECK(logits.dim() == 2 && logits.dtype() == DType::f32 && targets.dim() == 1 &&
                 targets.size(0) == logits.size(0))
      << "vocab_parallel_cross_entropy: f32 logits [N, V/T] and targets [N], got " << shape_str(logits.shape())
      << " and " << shape_str(targets.shape());
  const int64_t n = logits.size(0), columns = logits.size(1);
  const Device device = logits.device();  // every result lives where the logits do
  const Tensor x = logits.contiguous();
  const Tensor target = targets.contiguous().to(DType::i64);
#if LOCKSTEP_HAVE_CUDA
  if (device.is_cuda()) return cross_entropy_on_gpu(x, target.to(device), first, group);
#endif
  const float* v = x.data<float>();
  const int64_t* y = target.data<int64_t>();

  // Row maxima, then sums of exponentials and the target logits, over the whole vocabulary.
  Tensor max = Tensor::empty({n}, DType::f32, device), sums = Tensor::empty({n}, DType::f32, device),
         picked = Tensor::zeros({n}, DType::f32, device);
  float* mx = max.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    mx[i] = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < columns; ++j) mx[i] = std::max(mx[i], v[i * columns + j]);
  }
  group->all_reduce(max, comm::ReduceOp::max);
  Tensor probabilities = Tensor::empty({n, columns}, DType::f32, device);
  float* p = probabilities.data<float>();
  float* s = sums.data<float>();
  float* tg = picked.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    float total = 0;
    for (int64_t j = 0; j < columns; ++j) {
      p[i * columns + j] = std::exp(v[i * columns + j] - mx[i]);
      total += p[i * columns + j];
    }
    s[i] = total;
    const int64_t local = y[i] - first;
    if (local >= 0 && local < columns) tg[i] = v[i * columns + local] - mx[i];
  }
  group->all_reduce(sums);
  group->all_reduce(picked);
  Tensor loss = Tensor::empty({n}, DType::f32, device);
  float* l = loss.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    l[i] = std::log(s[i]) - tg[i];
    for (int64_t j = 0; j < columns; ++j) p[i * columns + j] /= s[i];
  }
  autograd::record("vocab_parallel_cross_entropy", {logits}, {loss},
                   [probabilities, target, first](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
                     const int64_t rows = probabilities.size(0), cols = probabilities.size(1);
                     Tensor g = probabilities.clone();
                     float* d = g.data<float>();
                     const Tensor upstream = grads[0].contiguous().to(DType::f32);
                     const float* u = upstream.data<float>();
                     const int64_t* t = target.data<int64_t>();
                     for (int64_t i = 0; i < rows; ++i) {
                       const int64_t local = t[i] - first;
                       if (local >= 0 && local < cols) d[i * cols + local] -= 1.0f;
                       for (int64_t j = 0; j < cols; ++j) d[i * cols + j] *= u[i];
                     }
                     return {g};
                   });
  return loss;
}

}  // namespace lockstep::parallel
