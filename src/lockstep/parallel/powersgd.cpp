#include "lockstep/parallel/powersgd.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lockstep/core/philox.h"

namespace lockstep::parallel {
namespace {

// PyTorch's min_compression_rate: a matrix is compressed only where P and Q together hold at
// most half its elements.
constexpr int64_t kMinCompressionRate = 2;

// out (n x r) = a (n x m) * b (m x r), all row-major.
void multiply(const float* a, const float* b, float* out, int64_t n, int64_t m, int r) {
  std::fill(out, out + n * r, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    float* row = out + i * r;
    for (int64_t k = 0; k < m; ++k) {
      const float x = a[i * m + k];
      const float* bk = b + k * r;
      for (int j = 0; j < r; ++j) row[j] += x * bk[j];
    }
  }
}

// out (m x r) = a^T (a: n x m) * p (n x r).
void multiply_transposed(const float* a, const float* p, float* out, int64_t n, int64_t m, int r) {
  std::fill(out, out + m * r, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const float* pi = p + i * r;
    const float* ai = a + i * m;
    for (int64_t k = 0; k < m; ++k) {
      float* row = out + k * r;
      for (int j = 0; j < r; ++j) row[j] += ai[k] * pi[j];
    }
  }
}

// Gram-Schmidt on the r columns of p (n x r): each column made orthogonal to those before it
// and of unit length. A column that vanishes (a rank-deficient gradient) stays zero.
void orthonormalize(float* p, int64_t n, int r) {
  for (int j = 0; j < r; ++j) {
    for (int k = 0; k < j; ++k) {
      double dot = 0;
      for (int64_t i = 0; i < n; ++i) dot += static_cast<double>(p[i * r + j]) * p[i * r + k];
      const auto d = static_cast<float>(dot);
      for (int64_t i = 0; i < n; ++i) p[i * r + j] -= d * p[i * r + k];
    }
    double norm = 0;
    for (int64_t i = 0; i < n; ++i) norm += static_cast<double>(p[i * r + j]) * p[i * r + j];
    const auto scale = norm > 0 ? static_cast<float>(1.0 / std::sqrt(norm)) : 0.0f;
    for (int64_t i = 0; i < n; ++i) p[i * r + j] *= scale;
  }
}

}  // namespace

PowerSgd::PowerSgd(const FlatGradients& layout, int rank, uint64_t seed) {
  LOCKSTEP_CHECK(rank >= 1) << "PowerSGD's rank must be at least 1, got " << rank;
  const std::vector<Tensor>& params = layout.params();
  LOCKSTEP_CHECK(params.front().dtype() == DType::f32 && params.front().device().is_cpu())
      << "PowerSGD compresses f32 gradients on CPU devices for now, got " << dtype_name(params.front().dtype())
      << " on " << params.front().device();
  int64_t p_elements = 0, q_elements = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& param = params[i];
    const int64_t begin = layout.offset(i), numel = param.numel();
    const int64_t rows = param.dim() >= 2 ? param.shape()[0] : 0;
    const int64_t cols = rows > 0 ? numel / rows : 0;
    const int r = static_cast<int>(std::min<int64_t>({rank, rows, cols}));
    if (rows > 0 && (rows + cols) * r * kMinCompressionRate <= numel) {
      matrices_.push_back(
          {.offset = begin, .rows = rows, .cols = cols, .rank = r, .p_at = p_elements, .q_at = q_elements});
      p_elements += rows * r;
      q_elements += cols * r;
    } else {
      plain_.emplace_back(begin, begin + numel);
      plain_numel_ += numel;
    }
  }
  p_ = Tensor::zeros({std::max<int64_t>(p_elements, 1)});
  q_ = Tensor::zeros({std::max<int64_t>(q_elements, 1)});
  error_ = Tensor::zeros({layout.padded_numel()});
  plain_buffer_ = Tensor::zeros({std::max<int64_t>(plain_numel_, 1)});
  Philox random(seed, /*stream=*/0x9057);
  float* q = q_.data_ptr<float>();
  for (int64_t i = 0; i < q_elements; ++i) q[i] = static_cast<float>(random.next_normal());
}

int64_t PowerSgd::elements_sent() const {
  int64_t sent = plain_numel_;
  for (const Matrix& m : matrices_) sent += (m.rows + m.cols) * m.rank;
  return sent;
}

void PowerSgd::reduce(const Tensor& gradient, comm::Communicator& comm) {
  float* g = gradient.data_ptr<float>();
  float* e = error_.data_ptr<float>();
  float* p = p_.data_ptr<float>();
  float* q = q_.data_ptr<float>();
  // The uncompressed part travels while the matrices are multiplied.
  float* plain = plain_buffer_.data_ptr<float>();
  int64_t at = 0;
  for (const auto& [begin, end] : plain_) {
    std::memcpy(plain + at, g + begin, static_cast<size_t>(end - begin) * sizeof(float));
    at += end - begin;
  }
  const Tensor plain_view = plain_buffer_.as_strided({plain_numel_}, {1}, 0);
  comm::Work plain_sent = comm.all_reduce_async(plain_view);

  for (const Matrix& m : matrices_) {
    float* a = g + m.offset;
    const float* err = e + m.offset;
    for (int64_t i = 0; i < m.rows * m.cols; ++i) a[i] += err[i];  // A = M + e
    multiply(a, q + m.q_at, p + m.p_at, m.rows, m.cols, m.rank);
  }
  if (!matrices_.empty()) comm.all_reduce(p_);
  for (const Matrix& m : matrices_) {
    orthonormalize(p + m.p_at, m.rows, m.rank);
    multiply_transposed(g + m.offset, p + m.p_at, q + m.q_at, m.rows, m.cols, m.rank);
  }
  if (!matrices_.empty()) comm.all_reduce(q_);
  const auto share = static_cast<float>(comm.size());
  for (const Matrix& m : matrices_) {
    float* a = g + m.offset;
    float* err = e + m.offset;
    const float* pm = p + m.p_at;
    const float* qm = q + m.q_at;
    for (int64_t i = 0; i < m.rows; ++i) {
      for (int64_t k = 0; k < m.cols; ++k) {
        float approx = 0;
        for (int j = 0; j < m.rank; ++j) approx += pm[i * m.rank + j] * qm[k * m.rank + j];
        // What this rank's input had beyond its even share of the approximation.
        err[i * m.cols + k] = a[i * m.cols + k] - approx / share;
        a[i * m.cols + k] = approx;
      }
    }
  }
  plain_sent.wait();
  at = 0;
  for (const auto& [begin, end] : plain_) {
    std::memcpy(g + begin, plain + at, static_cast<size_t>(end - begin) * sizeof(float));
    at += end - begin;
  }
}

NamedTensors PowerSgd::state() const { return {{"q", q_}, {"error", error_}}; }

void PowerSgd::load_state(const NamedTensors& state) {
  for (const auto& [name, tensor] : state) {
    const Tensor& mine = name == "q" ? q_ : name == "error" ? error_ : Tensor();
    LOCKSTEP_CHECK(mine.defined()) << "PowerSGD state has an unknown entry '" << name << "'";
    LOCKSTEP_CHECK(tensor.numel() == mine.numel() && tensor.dtype() == DType::f32)
        << "PowerSGD state '" << name << "' holds " << tensor.numel() << " " << dtype_name(tensor.dtype())
        << ", this model's needs " << mine.numel() << " f32: resume with the same model and --powersgd-rank";
    mine.copy_from(tensor);
  }
}

}  // namespace lockstep::parallel
