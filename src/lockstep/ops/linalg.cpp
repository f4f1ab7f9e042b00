#include "lockstep/ops/linalg.h"

#include "lockstep/autograd/node.h"
#include "lockstep/core/autocast.h"
#include "lockstep/ops/cpu/gemm.h"
#include "lockstep/ops/dispatch.h"
#include "lockstep/ops/reduce.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/ops/cuda/gemm.h"
#endif

namespace lockstep {
namespace {

// A 2-D matrix as BLAS sees it: a pointer, whether it is stored transposed, and its leading
// dimension. Row-major [r, c] with unit column stride is plain; unit row stride is a
// transposed view. Anything else is copied to contiguous first.
struct BlasMatrix {
  Tensor holder;  // keeps the bytes alive (a contiguous copy when one was needed)
  bool transposed = false;
  int64_t ld = 0;
};

BlasMatrix as_blas(const Tensor& m) {
  const int64_t rows = m.size(0), cols = m.size(1);
  const int64_t s0 = m.strides()[0], s1 = m.strides()[1];
  if ((s1 == 1 || cols == 1) && s0 >= std::max<int64_t>(cols, 1)) return {m, false, s0};
  if ((s0 == 1 || rows == 1) && s1 >= std::max<int64_t>(rows, 1)) return {m, true, s1};
  Tensor dense = Tensor::empty(m.shape(), m.dtype(), m.device());
  dense.copy_from(m);
  return {dense, false, std::max<int64_t>(cols, 1)};
}

// The transposed view of a 2-D tensor (no copy, no autograd).
Tensor t2(const Tensor& m) {
  return m.as_strided({m.size(1), m.size(0)}, {m.strides()[1], m.strides()[0]}, m.offset());
}

bool reduced(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }

// The type a product of a and b reads them in when one is already rounded to bf16 or f16 (an
// activation kept for backward, as_product_operand), else f32 (autocast may still round both).
DType reduced_type(const Tensor& a, const Tensor& b) {
  const DType type = reduced(a.dtype()) ? a.dtype() : reduced(b.dtype()) ? b.dtype() : DType::f32;
  LOCKSTEP_CHECK(!reduced(a.dtype()) || !reduced(b.dtype()) || a.dtype() == b.dtype())
      << "matmul: operands of " << dtype_name(a.dtype()) << " and " << dtype_name(b.dtype())
      << "; a product reads both in one type";
  return type;
}

// A product's output type: f32 where an operand is rounded, else the operands'.
DType product_dtype(const Tensor& a, const Tensor& b) {
  return reduced_type(a, b) != DType::f32 ? DType::f32 : a.dtype();
}

// Under autocast, an activation a product reads is rounded to autocast's type once: the
// forward product reads that copy, and backward keeps it instead of the f32 tensor — half
// the bytes, the same bits, since its products would round it alike. Kept as they are:
// leaves (parameters and data live on anyway; outside the graph nothing is kept), and bytes
// another tensor shares — a view's, or what another op keeps for its backward (relu's and
// softmax's outputs) — which live on anyway, so a rounded copy would add memory, not save it.
Tensor as_product_operand(const Tensor& t) {
  const DType type = autocast_dtype();
  if (type == DType::f32 || t.dtype() != DType::f32 || t.is_leaf() || t.storage().use_count() > 1) return t.detach();
  return t.detach().to(type);
}

// A 2-D operand of bf16 or f16 as f32 (exact), in the same BLAS layout: a transposed view
// stays one, so the CPU runs the kernel the f32 tensor would get.
Tensor widened(const Tensor& m) {
  if (!reduced(m.dtype())) return m;
  return as_blas(m).transposed ? t2(t2(m).to(DType::f32)) : m.to(DType::f32);
}

// out[m, n] = beta · out + a[m, k] @ b[k, n]; out contiguous. With a bias [n] (beta 0), out =
// a @ b + the bias in every row: the bits of out holding the bias with beta 1, which is how
// GPUs compute it; the CPU kernel adds it as it stores its tiles. An operand of bf16 or f16
// makes the product read both in that type (out is f32).
void gemm_into(const Tensor& a, const Tensor& b, const Tensor& out, double beta, const Tensor& bias = Tensor()) {
  if (const DType type = reduced_type(a, b); type != DType::f32) {
#if LOCKSTEP_HAVE_CUDA
    if (out.device().is_cuda()) {
      const BlasMatrix A = as_blas(a), B = as_blas(b);
      const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
      if (bias.defined()) {
        out.copy_from(bias.as_strided({m, n}, {0, bias.strides()[0]}, bias.offset()));
        beta = 1.0;
      }
      ops::cuda::gemm_mixed(A.transposed, B.transposed, m, n, k, A.holder.data_ptr(), a.dtype(), A.ld, 0,
                            B.holder.data_ptr(), b.dtype(), B.ld, 0, static_cast<float>(beta), out.data_ptr<float>(),
                            std::max<int64_t>(n, 1), 0, 1, out.device());
      return;
    }
#endif
    // The CPU multiplies f32 values; autocast has it round the other operand alike.
    const AutocastGuard as_kept(type);
    return gemm_into(widened(a), widened(b), out, beta, bias);
  }
  const BlasMatrix A = as_blas(a), B = as_blas(b);
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  ops::dispatch_float("matmul", a.dtype(), [&]<typename T>() {
#if LOCKSTEP_HAVE_CUDA
    if (out.device().is_cuda()) {
      if (bias.defined()) {
        out.copy_from(bias.as_strided({m, n}, {0, bias.strides()[0]}, bias.offset()));
        beta = 1.0;
      }
      ops::cuda::gemm<T>(A.transposed, B.transposed, m, n, k, T(1), A.holder.data_ptr<T>(), A.ld,
                         B.holder.data_ptr<T>(), B.ld, static_cast<T>(beta), out.data_ptr<T>(), std::max<int64_t>(n, 1),
                         out.device());
      return;
    }
#endif
    const Tensor row = bias.defined() ? bias.contiguous() : Tensor();
    cpu::gemm<T>(A.transposed, B.transposed, m, n, k, T(1), A.holder.data<T>(), A.ld, B.holder.data<T>(), B.ld,
                 static_cast<T>(beta), out.data<T>(), std::max<int64_t>(n, 1), row.defined() ? row.data<T>() : nullptr);
  });
}

// Plain 2-D product without autograd.
Tensor mm(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty({a.size(0), b.size(1)}, product_dtype(a, b), a.device());
  gemm_into(a, b, out, 0.0);
  return out;
}

// Entry i of a [B, r, c] batch as a 2-D view (a 2-D matrix is every batch entry).
Tensor batch_entry(const Tensor& t, int64_t i) {
  if (t.dim() == 2) return t;
  return t.as_strided({t.size(1), t.size(2)}, {t.strides()[1], t.strides()[2]}, t.offset() + i * t.strides()[0]);
}

#if LOCKSTEP_HAVE_CUDA
// A [B, r, c] batch as one operand of a strided-batched GEMM: each entry's BLAS layout (as
// as_blas) and the distance between entries. Copied to contiguous when the entries are not
// BLAS matrices, or when they all share one matrix (batch stride 0, from expand), which
// cuBLAS's strided batches are not documented to accept.
struct BlasBatch {
  Tensor holder;
  bool transposed = false;
  int64_t ld = 0, stride = 0;
};

BlasBatch as_blas_batch(const Tensor& t) {
  const int64_t rows = t.size(1), cols = t.size(2);
  const int64_t s0 = t.strides()[0], s1 = t.strides()[1], s2 = t.strides()[2];
  if (s0 > 0) {
    if ((s2 == 1 || cols == 1) && s1 >= std::max<int64_t>(cols, 1)) return {t, false, s1, s0};
    if ((s1 == 1 || rows == 1) && s2 >= std::max<int64_t>(rows, 1)) return {t, true, s2, s0};
  }
  Tensor dense = Tensor::empty(t.shape(), t.dtype(), t.device());
  dense.copy_from(t);
  return {dense, false, std::max<int64_t>(cols, 1), std::max<int64_t>(rows * cols, 1)};
}

// [B, m, k] as one [B·m, k] matrix: a view when the rows of all entries are evenly spaced,
// else a contiguous copy.
Tensor fold_batch(const Tensor& a) {
  const int64_t batch = a.size(0), m = a.size(1), k = a.size(2);
  const int64_t s0 = a.strides()[0], s1 = a.strides()[1], s2 = a.strides()[2];
  if (m == 1) return a.as_strided({batch, k}, {s0, s2}, a.offset());
  if (batch == 1 || s0 == m * s1) return a.as_strided({batch * m, k}, {s1, s2}, a.offset());
  Tensor dense = Tensor::empty(a.shape(), a.dtype(), a.device());
  dense.copy_from(a);
  return dense.as_strided({batch * m, k}, {k, 1}, 0);
}

// out[B, m, n] (contiguous) = a @ b on a GPU in one cuBLAS call: a strided batch, or, when b
// is one matrix for every entry, a single [B·m, k] @ [k, n] product.
void bmm_cuda(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2), k = a.size(-1);
  if (out.numel() == 0) return;
  if (k == 0) {
    out.zero();
    return;
  }
  if (b.dim() == 2) {
    gemm_into(fold_batch(a), b, out.as_strided({batch * m, n}, {n, 1}, out.offset()), 0.0);
    return;
  }
  if (batch == 1) {
    gemm_into(batch_entry(a, 0), batch_entry(b, 0), batch_entry(out, 0), 0.0);
    return;
  }
  const BlasBatch A = as_blas_batch(a), B = as_blas_batch(b);
  if (reduced_type(a, b) != DType::f32) {
    ops::cuda::gemm_mixed(A.transposed, B.transposed, m, n, k, A.holder.data_ptr(), a.dtype(), A.ld, A.stride,
                          B.holder.data_ptr(), b.dtype(), B.ld, B.stride, 0.0f, out.data_ptr<float>(), n, m * n, batch,
                          out.device());
    return;
  }
  ops::dispatch_float("matmul", a.dtype(), [&]<typename T>() {
    ops::cuda::gemm_strided_batched<T>(A.transposed, B.transposed, m, n, k, T(1), A.holder.data_ptr<T>(), A.ld,
                                       A.stride, B.holder.data_ptr<T>(), B.ld, B.stride, T(0), out.data_ptr<T>(), n,
                                       m * n, batch, out.device());
  });
}
#endif

// Batched product without autograd: [B, m, k] @ [B, k, n] (either may be a 2-D matrix shared
// by every batch entry).
Tensor bmm(const Tensor& a, const Tensor& b) {
  const int64_t batch = a.dim() == 3 ? a.size(0) : b.size(0);
  const int64_t m = a.size(-2), n = b.size(-1);
  Tensor out = Tensor::empty({batch, m, n}, product_dtype(a, b), a.device());
#if LOCKSTEP_HAVE_CUDA
  if (out.device().is_cuda()) {
    bmm_cuda(a, b, out);
    return out;
  }
#endif
  for (int64_t i = 0; i < batch; ++i) gemm_into(batch_entry(a, i), batch_entry(b, i), batch_entry(out, i), 0.0);
  return out;
}

// Transposes the last two axes of a 2-D or 3-D tensor as a view.
Tensor transpose_last(const Tensor& t) {
  if (t.dim() == 2) return t2(t);
  return t.as_strided({t.size(0), t.size(2), t.size(1)}, {t.strides()[0], t.strides()[2], t.strides()[1]}, t.offset());
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  const Device device = ops::common_device("matmul", {a, b});
  ops::require_device("matmul", device);
  ops::require_float("matmul", a);
  LOCKSTEP_CHECK(a.dtype() == b.dtype()) << "matmul: dtypes differ (" << dtype_name(a.dtype()) << " and "
                                         << dtype_name(b.dtype()) << ")";
  LOCKSTEP_CHECK((a.dim() == 2 || a.dim() == 3) && (b.dim() == 2 || b.dim() == 3) && !(a.dim() == 2 && b.dim() == 3))
      << "matmul: supports [m,k]@[k,n], [b,m,k]@[b,k,n] and [b,m,k]@[k,n]; got " << shape_str(a.shape()) << " @ "
      << shape_str(b.shape());
  LOCKSTEP_CHECK(a.size(-1) == b.size(-2))
      << "matmul: inner dimensions differ: " << shape_str(a.shape()) << " @ " << shape_str(b.shape());
  if (a.dim() == 3 && b.dim() == 3) {
    LOCKSTEP_CHECK(a.size(0) == b.size(0))
        << "matmul: batch sizes differ: " << shape_str(a.shape()) << " @ " << shape_str(b.shape());
  }
  const bool batched = a.dim() == 3;
  const Tensor ap = as_product_operand(a), bp = as_product_operand(b);
  Tensor out = batched ? bmm(ap, bp) : mm(ap, bp);
  const bool b_shared = batched && b.dim() == 2;
  autograd::record("MatmulBackward", {a, b}, {out},
                   [a = ap, b = bp, batched, b_shared, need_a = a.requires_grad(),
                    need_b = b.requires_grad()](const std::vector<Tensor>& g) {
                     const Tensor& grad = g[0];
                     Tensor grad_a, grad_b;
                     if (need_a) grad_a = batched ? bmm(grad, transpose_last(b)) : mm(grad, t2(b));
                     if (need_b) {
                       if (!batched) {
                         grad_b = mm(t2(a), grad);
                       } else {
                         grad_b = bmm(transpose_last(a), grad);
                         if (b_shared) grad_b = sum_to(grad_b, b.shape());
                       }
                     }
                     return std::vector<Tensor>{grad_a, grad_b};
                   });
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const Device device = ops::common_device("linear", {x, weight, bias});
  ops::require_device("linear", device);
  ops::require_float("linear", x);
  LOCKSTEP_CHECK(weight.dim() == 2) << "linear: weight must be [out, in], got " << shape_str(weight.shape());
  LOCKSTEP_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1))
      << "linear: input " << shape_str(x.shape()) << " does not match weight [out, in] = " << shape_str(weight.shape())
      << " (the last input axis must be " << weight.size(1) << ")";
  LOCKSTEP_CHECK(x.dtype() == weight.dtype())
      << "linear: input is " << dtype_name(x.dtype()) << " but weight is " << dtype_name(weight.dtype());
  const int64_t in = weight.size(1), out_features = weight.size(0);
  if (bias.defined()) {
    LOCKSTEP_CHECK(bias.dim() == 1 && bias.size(0) == out_features && bias.dtype() == x.dtype())
        << "linear: bias must be [" << out_features << "] of " << dtype_name(x.dtype()) << ", got "
        << shape_str(bias.shape()) << " " << dtype_name(bias.dtype());
  }
  const Tensor xc = x.contiguous();
  const int64_t rows = x.numel() / std::max<int64_t>(in, 1);
  const Tensor xp = as_product_operand(xc);
  const Tensor x2 = xp.as_strided({rows, in}, {in, 1}, xp.offset());
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Tensor out = Tensor::empty(out_shape, x.dtype(), device);
  const Tensor out2 = out.as_strided({rows, out_features}, {out_features, 1}, 0);
  gemm_into(x2, t2(weight.detach()), out2, 0.0, bias.defined() ? bias.detach() : Tensor());

  autograd::record(
      "LinearBackward", {xc, weight, bias}, {out},
      [x2, w = weight.detach(), w_leaf = autograd::leaf_of(weight), rows, in, out_features, need_x = xc.requires_grad(),
       need_w = weight.requires_grad(), need_b = bias.defined() && bias.requires_grad()](const std::vector<Tensor>& g) {
        const Tensor grad = g[0].contiguous();
        const Tensor g2 = grad.as_strided({rows, out_features}, {out_features, 1}, grad.offset());
        Tensor grad_x, grad_w, grad_b;
        if (need_x) {
          Shape shape = grad.shape();
          shape.back() = in;
          grad_x = Tensor::empty(shape, grad.dtype(), grad.device());
          gemm_into(g2, w, grad_x.as_strided({rows, in}, {in, 1}, 0), 0.0);
        }
        if (need_w) {
          // Straight into the weight's grad destination (a gradient bucket) when it has one.
          grad_w = autograd::gradient_output(w_leaf, {out_features, in}, grad.dtype(), grad.device());
          gemm_into(t2(g2), x2, grad_w, 0.0);
        }
        if (need_b) grad_b = sum_to(g2, {out_features});
        return std::vector<Tensor>{grad_x, grad_w, grad_b};
      });
  return out;
}

}  // namespace lockstep
