#include "lockstep/data/dataset.h"

#include <cstring>
#include <numeric>

#include "lockstep/core/parallel.h"

namespace lockstep {
namespace {

// Rows must be contiguous for memcpy gathers and for views; a tensor that is not gets
// one contiguous copy up front rather than a strided gather every step.
Tensor contiguous_cpu(const std::string& name, const Tensor& t) {
  LOCKSTEP_CHECK(t.device().is_cpu()) << "dataset field '" << name << "' is on " << t.device()
                                      << "; keep datasets on the CPU and move each batch to its device";
  if (t.is_contiguous()) return t.detach();
  Tensor copy = Tensor::empty(t.shape(), t.dtype());
  copy.copy_from(t);
  return copy;
}

// A view of rows [start, start + count) along axis 0.
Tensor row_view(const Tensor& t, int64_t start, int64_t count) {
  Shape shape = t.shape();
  shape[0] = count;
  return t.as_strided(shape, t.strides(), t.offset() + start * t.strides()[0]);
}

}  // namespace

TensorBatch Dataset::range(int64_t first, int64_t count) const {
  std::vector<int64_t> rows(static_cast<size_t>(count));
  std::iota(rows.begin(), rows.end(), first);
  return get(rows);
}

TensorDataset::TensorDataset(const TensorBatch& fields) {
  LOCKSTEP_CHECK(!fields.fields().empty()) << "a TensorDataset needs at least one field";
  NamedTensors contiguous;
  for (const auto& [name, tensor] : fields.fields()) contiguous.emplace_back(name, contiguous_cpu(name, tensor));
  fields_ = TensorBatch(std::move(contiguous));
}

TensorBatch TensorDataset::get(const std::vector<int64_t>& rows) const {
  NamedTensors out;
  for (const auto& [name, tensor] : fields_.fields()) out.emplace_back(name, gather_rows(tensor, rows));
  return TensorBatch(std::move(out));
}

TensorBatch TensorDataset::range(int64_t first, int64_t count) const {
  LOCKSTEP_CHECK(first >= 0 && count >= 0 && first + count <= size())
      << "rows [" << first << ", " << first + count << ") are outside a dataset of " << size();
  NamedTensors out;
  for (const auto& [name, tensor] : fields_.fields()) out.emplace_back(name, row_view(tensor, first, count));
  return TensorBatch(std::move(out));
}

Tensor gather_rows(const Tensor& source, const std::vector<int64_t>& rows) {
  LOCKSTEP_CHECK(source.dim() >= 1 && source.is_contiguous() && source.device().is_cpu())
      << "gather_rows: needs a contiguous CPU tensor with a sample axis, got " << source;
  const int64_t n = source.size(0);
  Shape shape = source.shape();
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor out = Tensor::empty(shape, source.dtype());
  const size_t row_bytes = n == 0 ? 0 : source.nbytes() / static_cast<size_t>(n);
  for (int64_t row : rows) {
    LOCKSTEP_CHECK(row >= 0 && row < n) << "gather_rows: row " << row << " is outside [0, " << n << ")";
  }
  if (row_bytes == 0) return out;
  const char* src = static_cast<const char*>(source.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  // Threads join only for megabytes each. A batch of 256 Fashion-MNIST images (800 KiB)
  // takes about 0.2 ms on one thread, and a second would nearly halve that on idle cores;
  // but under dp the calling thread is device 0's, and the team's pool thread, left
  // spinning beside the devices' threads, halved the MLP's two-device throughput.
  const auto grain = static_cast<int64_t>(std::max<size_t>(1, (size_t{1} << 20) / row_bytes));
  parallel_for(static_cast<int64_t>(rows.size()), grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      std::memcpy(dst + static_cast<size_t>(i) * row_bytes,
                  src + static_cast<size_t>(rows[static_cast<size_t>(i)]) * row_bytes, row_bytes);
  });
  return out;
}

}  // namespace lockstep
