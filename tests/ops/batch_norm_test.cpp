// ops::batch_norm: forward and batch statistics against naive float64 loops, backward against
// the same formula composed of autograd's elementwise ops and against finite differences, in
// training and eval; bits independent of the thread count; argument errors.
#include "lockstep/ops/batch_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lockstep/core/parallel.h"
#include "lockstep/ops/ops.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::expect_all_close;
using testing::expect_gradients_match;
using testing::random_f64;

// Channel c's values of x [N, C, ...], read in plain nested loops.
struct NaiveStats {
  std::vector<double> mean, biased_var, unbiased_var;
};

NaiveStats naive_stats(const Tensor& x) {
  const auto v = x.to_vector<double>();
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c);
  NaiveStats out;
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s; ++j) sum += v[static_cast<size_t>((i * c + ch) * s + j)];
    const double mean = sum / static_cast<double>(n * s);
    double squares = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s; ++j) {
        const double d = v[static_cast<size_t>((i * c + ch) * s + j)] - mean;
        squares += d * d;
      }
    out.mean.push_back(mean);
    out.biased_var.push_back(squares / static_cast<double>(n * s));
    out.unbiased_var.push_back(squares / static_cast<double>(n * s - 1));
  }
  return out;
}

// (x - mean[c]) / sqrt(var[c] + eps) · w[c] + b[c], element by element.
std::vector<double> naive_normalize(const Tensor& x, const std::vector<double>& mean, const std::vector<double>& var,
                                    const Tensor& w, const Tensor& b, double eps) {
  const auto v = x.to_vector<double>();
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c);
  const auto wv = w.defined() ? w.to_vector<double>() : std::vector<double>(static_cast<size_t>(c), 1.0);
  const auto bv = b.defined() ? b.to_vector<double>() : std::vector<double>(static_cast<size_t>(c), 0.0);
  std::vector<double> out(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t j = 0; j < s; ++j) {
        const auto k = static_cast<size_t>((i * c + ch) * s + j), cc = static_cast<size_t>(ch);
        out[k] = (v[k] - mean[cc]) / std::sqrt(var[cc] + eps) * wv[cc] + bv[cc];
      }
  return out;
}

// The training forward composed of differentiable ops, for its autograd backward.
Tensor composed_batch_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  std::vector<int64_t> axes{0};
  Shape channel_shape(static_cast<size_t>(x.dim()), 1);
  channel_shape[1] = x.size(1);
  for (int64_t a = 2; a < x.dim(); ++a) axes.push_back(a);
  const Tensor centred = x - mean(x, axes, true);
  const Tensor var = mean(square(centred), axes, true);
  Tensor y = centred / sqrt(var + eps);
  if (w.defined()) y = y * reshape(w, channel_shape);
  if (b.defined()) y = y + reshape(b, channel_shape);
  return y;
}

TEST(BatchNormOp, TrainingMatchesNaiveLoops) {
  for (const Shape& shape : {Shape{6, 3}, Shape{4, 3, 5}, Shape{3, 4, 2, 5}}) {
    const Tensor x = random_f64(shape, 1, -2, 3);
    const int64_t c = shape[1];
    const Tensor w = random_f64({c}, 2), b = random_f64({c}, 3);
    const NaiveStats stats = naive_stats(x);
    const BatchNormResult r = batch_norm(x, Tensor(), Tensor(), w, b, true, 1e-3);
    expect_all_close(r.output, naive_normalize(x, stats.mean, stats.biased_var, w, b, 1e-3), 1e-12, 1e-12);
    ASSERT_EQ(r.mean.dtype(), DType::f64);
    expect_all_close(r.mean, stats.mean, 1e-13, 1e-13);
    expect_all_close(r.unbiased_var, stats.unbiased_var, 1e-13, 1e-13);
    const BatchNormResult plain = batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true);
    expect_all_close(plain.output, naive_normalize(x, stats.mean, stats.biased_var, Tensor(), Tensor(), 1e-5), 1e-12,
                     1e-12);

    const Tensor x32 = x.to(DType::f32);
    const BatchNormResult r32 = batch_norm(x32, Tensor(), Tensor(), w.to(DType::f32), b.to(DType::f32), true, 1e-3);
    EXPECT_EQ(r32.output.dtype(), DType::f32);
    const NaiveStats stats32 = naive_stats(x32);
    expect_all_close(r32.output,
                     naive_normalize(x32, stats32.mean, stats32.biased_var, w.to(DType::f32), b.to(DType::f32), 1e-3),
                     1e-6, 1e-6);
    expect_all_close(r32.unbiased_var, stats32.unbiased_var, 1e-13, 1e-13);  // f64 statistics of the f32 values
  }
}

TEST(BatchNormOp, EvalUsesTheRunningStatistics) {
  const Tensor x = random_f64({3, 4, 2, 2}, 4, -2, 3);
  const Tensor running_mean = random_f64({4}, 5).to(DType::f32), running_var = random_f64({4}, 6, 0.5, 2);
  const Tensor w = random_f64({4}, 7), b = random_f64({4}, 8);
  const BatchNormResult r = batch_norm(x, running_mean, running_var, w, b, false, 1e-5);
  EXPECT_FALSE(r.mean.defined());
  EXPECT_FALSE(r.unbiased_var.defined());
  expect_all_close(r.output,
                   naive_normalize(x, running_mean.to_vector<double>(), running_var.to_vector<double>(), w, b, 1e-5),
                   1e-12, 1e-12);
}

TEST(BatchNormOp, BackwardMatchesTheComposedOps) {
  for (const Shape& shape : {Shape{5, 3}, Shape{2, 3, 4}, Shape{2, 3, 3, 2}}) {
    const int64_t c = shape[1];
    Tensor x = random_f64(shape, 9, -1, 2), w = random_f64({c}, 10), b = random_f64({c}, 11);
    for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
    const Tensor projection = random_f64(shape, 12);
    sum(batch_norm(x, Tensor(), Tensor(), w, b, true, 1e-2).output * projection).backward();
    const Tensor gx = x.grad(), gw = w.grad(), gb = b.grad();
    for (Tensor* t : {&x, &w, &b}) t->set_grad(Tensor());
    sum(composed_batch_norm(x, w, b, 1e-2) * projection).backward();
    expect_all_close(gx, x.grad(), 1e-11, 1e-11);
    expect_all_close(gw, w.grad(), 1e-11, 1e-11);
    expect_all_close(gb, b.grad(), 1e-11, 1e-11);
  }
}

TEST(BatchNormOp, GradientsMatchFiniteDifferences) {
  Tensor x = random_f64({4, 3, 2}, 13, -1, 2), w = random_f64({3}, 14), b = random_f64({3}, 15);
  for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true).output; },
      {x, w, b});
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return batch_norm(in[0], Tensor(), Tensor(), {}, {}, true).output; }, {x});
  Tensor x2 = random_f64({5, 2}, 16);
  x2.set_requires_grad(true);
  expect_gradients_match(
      [&](const std::vector<Tensor>& in) { return batch_norm(in[0], Tensor(), Tensor(), in[1], {}, true).output; },
      {x2, random_f64({2}, 17).set_requires_grad(true)});
  // Eval: the statistics are constants.
  const Tensor running_mean = random_f64({3}, 18), running_var = random_f64({3}, 19, 0.5, 2);
  expect_gradients_match(
      [&](const std::vector<Tensor>& in) {
        return batch_norm(in[0], running_mean, running_var, in[1], in[2], false).output;
      },
      {x, w, b});
}

TEST(BatchNormOp, BitsDoNotDependOnTheThreadCount) {
  const Tensor x = random_f64({8, 64, 6, 6}, 20, -1, 3).to(DType::f32);
  const Tensor w = random_f64({64}, 21).to(DType::f32), b = random_f64({64}, 22).to(DType::f32);
  const Tensor projection = random_f64(x.shape(), 23).to(DType::f32);
  std::vector<std::vector<float>> runs[2];
  std::vector<double> stats[2];
  const int before = num_threads();
  for (int k = 0; k < 2; ++k) {
    set_num_threads(k == 0 ? 1 : 4);
    const Tensor xl = x.clone().set_requires_grad(true), wl = w.clone().set_requires_grad(true),
                 bl = b.clone().set_requires_grad(true);
    const BatchNormResult r = batch_norm(xl, Tensor(), Tensor(), wl, bl, true);
    sum(r.output * projection).backward();
    runs[k] = {r.output.to_vector<float>(), xl.grad().to_vector<float>(), wl.grad().to_vector<float>(),
               bl.grad().to_vector<float>()};
    stats[k] = r.unbiased_var.to_vector<double>();
  }
  set_num_threads(before);
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(stats[0], stats[1]);
}

TEST(BatchNormOp, RejectsBadArguments) {
  const Tensor x = Tensor::zeros({4, 3});
  EXPECT_THROW(batch_norm(Tensor::zeros({4}), Tensor(), Tensor(), {}, {}, true), Error);
  EXPECT_THROW(batch_norm(x, Tensor(), Tensor(), Tensor::ones({4}), {}, true), Error);
  EXPECT_THROW(batch_norm(x, Tensor(), Tensor(), {}, Tensor::ones({3}, DType::f64), true), Error);
  EXPECT_THROW(batch_norm(Tensor::zeros({1, 3}), Tensor(), Tensor(), {}, {}, true), Error);  // 1 value per channel
  EXPECT_THROW(batch_norm(x, Tensor(), Tensor(), {}, {}, false), Error);                     // eval needs running stats
  EXPECT_THROW(batch_norm(x, Tensor::zeros({2}), Tensor::ones({3}), {}, {}, false), Error);
  EXPECT_THROW(batch_norm(x, Tensor(), Tensor(), {}, {}, true, -1.0), Error);
  EXPECT_THROW(batch_norm(Tensor::zeros({4, 3}, DType::i64), Tensor(), Tensor(), {}, {}, true), Error);
  EXPECT_NO_THROW(batch_norm(Tensor::zeros({1, 3}), Tensor::zeros({3}), Tensor::ones({3}), {}, {}, false));
}

}  // namespace
}  // namespace lockstep
