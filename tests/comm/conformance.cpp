#include "comm/conformance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace lockstep::comm::testing {
namespace {

// The largest count spans many blocks of the fold and, on shm, several staging pieces.
// ThreadSanitizer makes every access some 10x slower: there, 2^16+1 still spans blocks.
#if defined(__SANITIZE_THREAD__)
constexpr int64_t kLargeCount = (int64_t{1} << 16) + 1;
#else
constexpr int64_t kLargeCount = (int64_t{1} << 20) + 1;
#endif
const int64_t kCounts[] = {0, 1, 7, 1000, kLargeCount};
const DType kDTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64};

// A tensor of `count` elements of dtype whose element i is value(i) (exactly representable).
template <typename F>
Tensor filled(DType dtype, int64_t count, F value) {
  std::vector<double> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[i] = value(i);
  Tensor t = Tensor::empty({count}, dtype);
  convert_elements(values.data(), DType::f64, t.raw_data(), dtype, count);
  return t;
}

std::vector<double> as_doubles(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  convert_elements(t.raw_data(), t.dtype(), out.data(), DType::f64, t.numel());
  return out;
}

// Largest power of two below n, by doubling (not the library's bit trick).
int split_point(int n) {
  int p = 1;
  while (p * 2 < n) p *= 2;
  return p;
}

template <typename T>
T tree_sum(const T* v, int n) {
  if (n == 1) return v[0];
  const int p = split_point(n);
  return tree_sum(v, p) + tree_sum(v + p, n - p);
}

// The same tree with every node's sum rounded by `round` (rounded_sum's definition).
template <typename Round>
float rounded_tree_sum(const float* v, int n, Round round) {
  if (n == 1) return v[0];
  const int p = split_point(n);
  return round(rounded_tree_sum(v, p, round) + rounded_tree_sum(v + p, n - p, round));
}

// Expects t's elements to equal expected(i) rounded once to t's dtype (the exact total,
// which the reduction holds in f32 or wider before it stores it); reports the first few
// differences.
template <typename F>
void expect_values(const Tensor& t, F expected, const std::string& what) {
  const std::vector<double> got = as_doubles(t);
  const std::vector<double> wanted = as_doubles(filled(t.dtype(), t.numel(), expected));
  int reported = 0;
  for (size_t i = 0; i < got.size() && reported < 3; ++i) {
    const double want = wanted[i];
    if (got[i] != want && !(std::isnan(got[i]) && std::isnan(want))) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want;
      ++reported;
    }
  }
}

}  // namespace

float irregular_value(int rank, int64_t i) {
  // Mixed magnitudes and signs: rounding depends on the order of the additions.
  const uint32_t h = static_cast<uint32_t>(rank * 2654435761u + static_cast<uint32_t>(i) * 40503u + 12345u);
  const float mantissa = static_cast<float>(h % 100003u) / 100003.0f;
  const int exponent = static_cast<int>((h >> 17) % 24) - 12;
  return std::ldexp(mantissa, exponent) * ((h >> 8) & 1 ? -1.0f : 1.0f);
}

double reference_tree_sum(const double* v, int n) { return tree_sum(v, n); }
float reference_tree_sum(const float* v, int n) { return tree_sum(v, n); }

void check_all_reduce_exact(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  for (DType dtype : kDTypes) {
    for (int64_t count : kCounts) {
      // Big buffers on one dtype each way is enough; the small counts cover every op.
      if (count > 1000 && dtype != DType::f32 && dtype != DType::bf16) continue;
      const std::string where = std::string(dtype_name(dtype)) + " x" + std::to_string(count);
      // sum: (r+1)·(i%7+1); the total (i%7+1)·n(n+1)/2 stays below 256, exact in bf16.
      Tensor t = filled(dtype, count, [&](int64_t i) { return (r + 1) * (i % 7 + 1); });
      comm.all_reduce(t, ReduceOp::sum);
      expect_values(
          t, [&](int64_t i) { return (i % 7 + 1) * n * (n + 1) / 2.0; }, "sum " + where);
      // max and min: the rank i%n holds the extreme value.
      t = filled(dtype, count, [&](int64_t i) { return r == i % n ? 100 + i % 5 : -(r + 1); });
      comm.all_reduce(t, ReduceOp::max);
      expect_values(
          t, [&](int64_t i) { return 100.0 + static_cast<double>(i % 5); }, "max " + where);
      t = filled(dtype, count, [&](int64_t i) { return r == i % n ? -50 - i % 3 : r; });
      comm.all_reduce(t, ReduceOp::min);
      expect_values(
          t, [&](int64_t i) { return -50.0 - static_cast<double>(i % 3); }, "min " + where);
      if (is_floating(dtype)) {
        // avg: every rank holds 2·n·(i%5): the mean is exact in every float type.
        t = filled(dtype, count, [&](int64_t i) { return 2.0 * n * static_cast<double>(i % 5); });
        comm.all_reduce(t, ReduceOp::avg);
        expect_values(
            t, [&](int64_t i) { return 2.0 * n * static_cast<double>(i % 5); }, "avg " + where);
      } else {
        Tensor small = Tensor::zeros({3}, dtype);
        EXPECT_THROW(comm.all_reduce(small, ReduceOp::avg), Error) << "avg of " << dtype_name(dtype);
      }
    }
  }
}

void check_all_reduce_tree_order(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  const int64_t count = 5000;  // several blocks, both all_reduce algorithms (f64 is 40 KB)
  std::vector<float> mine(count);
  for (int64_t i = 0; i < count; ++i) mine[i] = irregular_value(r, i);
  std::vector<float> column(n);
  std::vector<double> column64(n);

  Tensor t32 = Tensor::from_vector(mine, {count});
  comm.all_reduce(t32);
  Tensor t64 = Tensor::from_vector(std::vector<double>(mine.begin(), mine.end()), {count});
  comm.all_reduce(t64);
  Tensor tb = Tensor::empty({count}, DType::bf16);
  convert_elements(mine.data(), DType::f32, tb.raw_data(), DType::bf16, count);
  comm.all_reduce(tb);

  const float* got32 = t32.data<float>();
  const double* got64 = t64.data<double>();
  std::vector<float> gotb(count);
  convert_elements(tb.raw_data(), DType::bf16, gotb.data(), DType::f32, count);
  int wrong = 0;
  for (int64_t i = 0; i < count && wrong < 3; ++i) {
    for (int q = 0; q < n; ++q) {
      column[q] = irregular_value(q, i);
      column64[q] = column[q];
    }
    const float want32 = tree_sum(column.data(), n);
    const double want64 = tree_sum(column64.data(), n);
    // bf16 inputs are the rounded values; the sum runs in f32 and rounds once.
    for (int q = 0; q < n; ++q) column[q] = bf16_to_f32(f32_to_bf16(column[q]));
    const float wantb = bf16_to_f32(f32_to_bf16(tree_sum(column.data(), n)));
    if (std::memcmp(&got32[i], &want32, 4) != 0 || std::memcmp(&got64[i], &want64, 8) != 0 ||
        std::memcmp(&gotb[i], &wantb, 4) != 0) {
      ADD_FAILURE() << "tree order differs at element " << i << ": f32 " << got32[i] << " vs " << want32 << ", f64 "
                    << got64[i] << " vs " << want64 << ", bf16 " << gotb[i] << " vs " << wantb;
      ++wrong;
    }
  }
  check_rounded_sum_tree_order(comm);
}

void check_rounded_sum_tree_order(Communicator& comm) {
  const int n = comm.size();
  const int64_t count = 5000;
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    const auto round = [dtype](float x) {
      if (dtype == DType::bf16) return bf16_to_f32(f32_to_bf16(x));
      if (dtype == DType::f16) return f16_to_f32(f32_to_f16(x));
      return x;
    };
    std::vector<float> mine(count);
    for (int64_t i = 0; i < count; ++i) mine[i] = round(irregular_value(comm.rank(), i));
    Tensor t = Tensor::empty({count}, dtype);
    convert_elements(mine.data(), DType::f32, t.raw_data(), dtype, count);
    comm.all_reduce(t, ReduceOp::rounded_sum);
    std::vector<float> got(count);
    convert_elements(t.raw_data(), dtype, got.data(), DType::f32, count);
    std::vector<float> column(n);
    int wrong = 0;
    for (int64_t i = 0; i < count && wrong < 3; ++i) {
      for (int q = 0; q < n; ++q) column[q] = round(irregular_value(q, i));
      const float want = rounded_tree_sum(column.data(), n, round);
      if (std::memcmp(&got[i], &want, 4) != 0) {
        ADD_FAILURE() << dtype_name(dtype) << " rounded_sum differs at element " << i << ": " << got[i] << " vs "
                      << want;
        ++wrong;
      }
    }
  }
}

void check_reduce_scatter(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  for (DType dtype : {DType::f32, DType::i64, DType::bf16}) {
    for (int64_t count : {0, 1, 7, 1000}) {
      // Rank q's input element (s·count + i) is (q+1)·(s+1)·(i%3+1); slice s reduces on rank s.
      Tensor input = filled(dtype, n * count, [&](int64_t k) {
        const int64_t s = k / std::max<int64_t>(count, 1), i = k % std::max<int64_t>(count, 1);
        return (r + 1) * (s + 1) * (i % 3 + 1);
      });
      Tensor output = Tensor::full({count}, -7, dtype);
      comm.reduce_scatter(input, output, ReduceOp::sum);
      expect_values(
          output, [&](int64_t i) { return n * (n + 1) / 2.0 * (r + 1) * static_cast<double>(i % 3 + 1); },
          std::string("reduce_scatter ") + dtype_name(dtype) + " x" + std::to_string(count));
    }
  }
  Tensor input = Tensor::zeros({n * 4 + 1});
  Tensor output = Tensor::zeros({4});
  EXPECT_THROW(comm.reduce_scatter(input, output), Error) << "input not size() x output";
}

void check_all_gather(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  for (DType dtype : {DType::f32, DType::f16, DType::i32}) {
    for (int64_t count : {0, 1, 7, 1000}) {
      Tensor input = filled(dtype, count, [&](int64_t i) { return r * 10 + i % 9; });
      Tensor output = Tensor::full({n * count}, -1, dtype);
      comm.all_gather(input, output);
      expect_values(
          output, [&](int64_t k) { return static_cast<double>(k / count * 10 + (k % count) % 9); },
          std::string("all_gather ") + dtype_name(dtype) + " x" + std::to_string(count));
    }
  }
  // In place: the input is this rank's own slice of the output (ZeRO gathers weights so),
  // also in a buffer from empty_shared, where the peers read it directly.
  for (const bool shared : {false, true}) {
    const int64_t count = 1000;
    const Tensor output = shared ? comm.empty_shared({n * count}, DType::f32) : Tensor::empty({n * count});
    output.fill(-1);
    const Tensor mine = output.as_strided({count}, {1}, output.offset() + r * count);
    mine.copy_from(filled(DType::f32, count, [&](int64_t i) { return r * 10 + i % 9; }));
    comm.all_gather(mine, output);
    expect_values(
        output, [&](int64_t k) { return static_cast<double>(k / count * 10 + (k % count) % 9); },
        shared ? "all_gather in place, shared buffer" : "all_gather in place");
  }
}

void check_broadcast(Communicator& comm) {
  const int r = comm.rank();
  for (int root = 0; root < comm.size(); ++root) {
    for (int64_t count : {0, 7, 300000}) {
      Tensor t = filled(DType::f32, count, [&](int64_t i) { return r == root ? i % 1000 + root : -1; });
      comm.broadcast(t, root);
      expect_values(
          t, [&](int64_t i) { return static_cast<double>(i % 1000 + root); },
          "broadcast from " + std::to_string(root) + " x" + std::to_string(count));
    }
  }
}

void check_send_recv(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  if (n == 1) return;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // Sizes past one channel chunk, and empty messages, around the ring; tags in order.
  for (int64_t count : {0, 7, 300001}) {
    Tensor out = filled(DType::f32, count, [&](int64_t i) { return r * 1000 + i % 997; });
    Tensor in = Tensor::full({count}, -1, DType::f32);
    Work sent = comm.send_async(out, next, static_cast<int>(count % 5));
    comm.recv(in, prev, static_cast<int>(count % 5));
    sent.wait();
    expect_values(
        in, [&](int64_t i) { return static_cast<double>(prev * 1000 + i % 997); }, "recv x" + std::to_string(count));
  }
}

void check_barrier_and_async(Communicator& comm) {
  const int n = comm.size();
  for (int i = 0; i < 5; ++i) comm.barrier();
  std::vector<Tensor> tensors;
  std::vector<Work> works;
  for (int k = 0; k < 4; ++k) {
    tensors.push_back(Tensor::full({1000 * (k + 1)}, k + 1));
    works.push_back(comm.all_reduce_async(tensors.back()));
  }
  Tensor gathered = Tensor::empty({n * 3});
  works.push_back(comm.all_gather_async(Tensor::full({3}, comm.rank()), gathered));
  for (const Work& w : works) w.wait();
  for (int k = 0; k < 4; ++k) {
    expect_values(
        tensors[k], [&](int64_t) { return static_cast<double>((k + 1) * n); }, "async all_reduce");
  }
  expect_values(
      gathered, [&](int64_t i) { return static_cast<double>(i / 3); }, "async all_gather");
  EXPECT_TRUE(works.front().done());
}

void check_split(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  // Odd and even ranks, each group ranked in reverse; with more than two ranks the last
  // one stays out.
  const bool out = n > 2 && r == n - 1;
  const int color = out ? -1 : r % 2;
  std::shared_ptr<Communicator> sub = comm.split(color, -r);
  if (out) {
    EXPECT_EQ(sub, nullptr);
    comm.barrier();
    return;
  }
  ASSERT_NE(sub, nullptr);
  std::vector<int> members;
  for (int q = n - 1; q >= 0; --q) {
    if (q % 2 == color && !(n > 2 && q == n - 1)) members.push_back(q);
  }
  EXPECT_EQ(sub->size(), static_cast<int>(members.size()));
  EXPECT_EQ(sub->rank(), static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin()));
  Tensor t = Tensor::full({5}, r);
  sub->all_reduce(t);
  double sum = 0;
  for (int q : members) sum += q;
  expect_values(
      t, [&](int64_t) { return sum; }, "all_reduce in a split group");
  comm.barrier();  // the parent still works after a split
}

// empty_common: one zeroed buffer for all ranks where they share memory (each rank's
// element is written by it and read by all after a barrier), undefined where they do not.
void check_common_memory(Communicator& comm) {
  const int64_t stride = 16;  // a cache line of floats per rank
  const Tensor common = comm.empty_common({comm.size() * stride}, DType::f32);
  if (!comm.shares_memory()) {
    EXPECT_FALSE(common.defined()) << comm.backend() << " shares no memory";
    return;
  }
  ASSERT_TRUE(common.defined()) << comm.backend();
  EXPECT_EQ(common.shape(), (Shape{comm.size() * stride}));
  EXPECT_EQ(as_doubles(common), std::vector<double>(static_cast<size_t>(comm.size() * stride), 0.0));
  comm.barrier();  // all have read the zeros
  common.data<float>()[comm.rank() * stride] = static_cast<float>(comm.rank() + 1);
  comm.barrier();
  for (int q = 0; q < comm.size(); ++q) EXPECT_EQ(common.data<float>()[q * stride], q + 1.0f) << "rank " << q;
  comm.barrier();  // all have read before any lets go of it
}

void run_conformance(Communicator& comm) {
  check_all_reduce_exact(comm);
  check_all_reduce_tree_order(comm);
  check_reduce_scatter(comm);
  check_all_gather(comm);
  check_broadcast(comm);
  check_send_recv(comm);
  check_barrier_and_async(comm);
  check_split(comm);
  check_common_memory(comm);
}

void check_mismatch_is_named(Communicator& comm) {
  if (comm.size() == 1) return;  // nobody to disagree with
  const int odd = comm.size() - 1;
  Tensor t = Tensor::zeros({comm.rank() == odd ? 11 : 10});
  try {
    comm.all_reduce(t);
    ADD_FAILURE() << "rank " << comm.rank() << ": a count mismatch went unnoticed";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("rank 0 called all_reduce"), std::string::npos) << message;
    EXPECT_NE(message.find("rank " + std::to_string(odd) + " called all_reduce"), std::string::npos) << message;
    EXPECT_NE(message.find("11 f32"), std::string::npos) << message;
  }
}

}  // namespace lockstep::comm::testing
