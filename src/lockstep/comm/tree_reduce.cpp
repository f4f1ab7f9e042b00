#include "lockstep/comm/tree_reduce.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "lockstep/core/error.h"

namespace lockstep::comm {
namespace {

// Elements folded per block: the partial sums of every tree level stay in L1.
constexpr int64_t kBlock = 1024;

// Per-thread scratch for the partial sums, kept between calls: small collectives are
// latency-bound and should not allocate.
template <typename A>
A* scratch(size_t elements) {
  thread_local std::vector<A> buffer;
  if (buffer.size() < elements) buffer.resize(elements);
  return buffer.data();
}

struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};
// Storage type -> the type partial results are held in, and back. round(): a partial result
// rounded to the storage type's precision (rounded_sum).
template <typename T>
struct Accum {
  using type = T;
  static type load(T v) { return v; }
  static T store(type v) { return v; }
  static type round(type v) { return v; }
};
template <>
struct Accum<Bf16> {
  using type = float;
  static float load(Bf16 v) { return bf16_to_f32(v.bits); }
  static Bf16 store(float v) { return {f32_to_bf16(v)}; }
  static float round(float v) { return bf16_to_f32(f32_to_bf16(v)); }
};
template <>
struct Accum<F16> {
  using type = float;
  static float load(F16 v) { return f16_to_f32(v.bits); }
  static F16 store(float v) { return {f32_to_f16(v)}; }
  static float round(float v) { return f16_to_f32(f32_to_f16(v)); }
};

// Integer sums wrap (two's complement) instead of overflowing, which is undefined in C++.
template <typename A>
A add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
// NaN wins, as in PyTorch's max/min.
template <typename A>
A max_of(A a, A b) {
  return (a > b || a != a) ? a : b;
}
template <typename A>
A min_of(A a, A b) {
  return (a < b || a != a) ? a : b;
}

template <typename A, ReduceOp op>
A combine(A a, A b) {
  if constexpr (op == ReduceOp::max) {
    return max_of(a, b);
  } else if constexpr (op == ReduceOp::min) {
    return min_of(a, b);
  } else {
    return add(a, b);
  }
}

// rounded: every node's result is rounded to T's precision (rounded_sum).
template <typename T, ReduceOp op, bool rounded = false>
class TreeFolder {
 public:
  using A = typename Accum<T>::type;

  // Level 0 holds the block's result; level l > 0 the right half's partial at depth l.
  TreeFolder(const T* const* inputs, int n)
      : inputs_(inputs),
        n_(n),
        scratch_(scratch<A>(static_cast<size_t>(std::bit_width(static_cast<unsigned>(n)) + 2) * kBlock)) {}

  // Folds elements [begin, begin + len) of every input into dst.
  void fold(int lo, int hi, int64_t begin, int64_t len, A* dst, int level) {
    if (hi - lo == 1) {
      const T* x = inputs_[lo] + begin;
      for (int64_t i = 0; i < len; ++i) dst[i] = Accum<T>::load(x[i]);
      return;
    }
    const int mid = lo + tree_split(hi - lo);
    if (mid - lo == 1 && hi - mid == 1) {  // two leaves: straight from the inputs
      const T* a = inputs_[lo] + begin;
      const T* b = inputs_[mid] + begin;
      for (int64_t i = 0; i < len; ++i) dst[i] = join(Accum<T>::load(a[i]), Accum<T>::load(b[i]));
      return;
    }
    fold(lo, mid, begin, len, dst, level + 1);
    if (hi - mid == 1) {
      const T* b = inputs_[mid] + begin;
      for (int64_t i = 0; i < len; ++i) dst[i] = join(dst[i], Accum<T>::load(b[i]));
      return;
    }
    A* right = scratch_ + static_cast<size_t>(level + 1) * kBlock;
    fold(mid, hi, begin, len, right, level + 1);
    for (int64_t i = 0; i < len; ++i) dst[i] = join(dst[i], right[i]);
  }

  void run(T* const* outs, int n_out, int64_t count, bool average) {
    A* block = scratch_;
    const A divisor = static_cast<A>(n_);
    for (int64_t begin = 0; begin < count; begin += kBlock) {
      const int64_t len = std::min(kBlock, count - begin);
      fold(0, n_, begin, len, block, 0);
      if (average) {
        for (int64_t i = 0; i < len; ++i) block[i] /= divisor;
      }
      for (int k = 0; k < n_out; ++k) {
        T* o = outs[k] + begin;
        for (int64_t i = 0; i < len; ++i) o[i] = Accum<T>::store(block[i]);
      }
    }
  }

 private:
  static A join(A a, A b) {
    const A c = combine<A, op>(a, b);
    if constexpr (rounded) return Accum<T>::round(c);
    return c;
  }

  const T* const* inputs_;
  int n_;
  A* scratch_;
};

template <typename T>
void reduce_typed(const void* const* inputs, int n, void* const* outs, int n_out, int64_t count, ReduceOp op) {
  const auto* typed = reinterpret_cast<const T* const*>(inputs);
  T* const* o = reinterpret_cast<T* const*>(outs);
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      TreeFolder<T, ReduceOp::sum>(typed, n).run(o, n_out, count, op == ReduceOp::avg);
      break;
    case ReduceOp::max:
      TreeFolder<T, ReduceOp::max>(typed, n).run(o, n_out, count, false);
      break;
    case ReduceOp::min:
      TreeFolder<T, ReduceOp::min>(typed, n).run(o, n_out, count, false);
      break;
    case ReduceOp::rounded_sum:
      TreeFolder<T, ReduceOp::sum, true>(typed, n).run(o, n_out, count, false);
      break;
  }
}

}  // namespace

int tree_split(int n) {
  LOCKSTEP_CHECK(n >= 2) << "tree_split needs at least two leaves, got " << n;
  return static_cast<int>(std::bit_floor(static_cast<unsigned>(n - 1)));
}

void check_reducible(DType dtype, ReduceOp op) {
  LOCKSTEP_CHECK(dtype != DType::u8) << "cannot reduce u8 tensors: convert to i32 first";
  LOCKSTEP_CHECK(op != ReduceOp::avg || is_floating(dtype))
      << "avg of " << dtype_name(dtype) << " would truncate: use sum and divide, or a floating dtype";
}

void tree_reduce(const void* const* inputs, int n, void* out, int64_t count, DType dtype, ReduceOp op) {
  void* const outs[1] = {out};
  tree_reduce_to_many(inputs, n, outs, 1, count, dtype, op);
}

void tree_reduce_to_many(const void* const* inputs, int n, void* const* outs, int n_out, int64_t count, DType dtype,
                         ReduceOp op) {
  LOCKSTEP_CHECK(n >= 1) << "tree_reduce needs at least one input, got " << n;
  check_reducible(dtype, op);
  if (count == 0) return;
  switch (dtype) {
    case DType::f32:
      return reduce_typed<float>(inputs, n, outs, n_out, count, op);
    case DType::f64:
      return reduce_typed<double>(inputs, n, outs, n_out, count, op);
    case DType::bf16:
      return reduce_typed<Bf16>(inputs, n, outs, n_out, count, op);
    case DType::f16:
      return reduce_typed<F16>(inputs, n, outs, n_out, count, op);
    case DType::i32:
      return reduce_typed<int32_t>(inputs, n, outs, n_out, count, op);
    case DType::i64:
      return reduce_typed<int64_t>(inputs, n, outs, n_out, count, op);
    case DType::u8:
      break;
  }
  LOCKSTEP_FAIL() << "tree_reduce: unsupported dtype " << dtype_name(dtype);
}

}  // namespace lockstep::comm
