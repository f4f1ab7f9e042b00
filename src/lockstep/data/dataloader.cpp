#include "lockstep/data/dataloader.h"

#include <cstring>
#include <numeric>

#include "lockstep/core/parallel.h"
#include "lockstep/core/philox.h"

namespace lockstep {
namespace {

// Rows must be contiguous for memcpy gathers and for views; a dataset that is not gets
// one contiguous copy up front rather than a strided gather every step.
Tensor contiguous_cpu(const Tensor& t, const char* what) {
  LOCKSTEP_CHECK(t.defined()) << "DataLoader: the dataset's " << what << " tensor is undefined";
  LOCKSTEP_CHECK(t.device().is_cpu()) << "DataLoader: the dataset's " << what << " are on " << t.device()
                                      << "; keep datasets on the CPU and move each batch to its device";
  LOCKSTEP_CHECK(t.dim() >= 1) << "DataLoader: the dataset's " << what << " need a sample axis, got a scalar";
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

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  LOCKSTEP_CHECK(n >= 0) << "epoch_order: the sample count must be non-negative, got " << n;
  LOCKSTEP_CHECK(epoch >= 0 && epoch < (int64_t{1} << 24)) << "epoch_order: epoch must be in [0, 2^24), got " << epoch;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  Philox rng(seed, static_cast<uint64_t>(RngStream::shuffle), static_cast<uint64_t>(epoch) << 40);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.next_below(static_cast<uint64_t>(i + 1)));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
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

DataLoader::DataLoader(Dataset dataset, DataLoaderOptions options) : options_(options) {
  dataset_.images = contiguous_cpu(dataset.images, "images");
  dataset_.labels = contiguous_cpu(dataset.labels, "labels");
  n_ = dataset_.images.size(0);
  LOCKSTEP_CHECK(dataset_.labels.size(0) == n_)
      << "DataLoader: the dataset has " << n_ << " images but " << dataset_.labels.size(0) << " labels";
  LOCKSTEP_CHECK(options_.batch_size > 0) << "DataLoader: batch size must be positive, got " << options_.batch_size;
}

int64_t DataLoader::batches_per_epoch() const {
  return options_.drop_last ? n_ / options_.batch_size : (n_ + options_.batch_size - 1) / options_.batch_size;
}

const std::vector<int64_t>& DataLoader::order(int64_t epoch) {
  LOCKSTEP_CHECK(epoch >= 0) << "DataLoader: epoch must be non-negative, got " << epoch;
  if (!options_.shuffle) epoch = 0;  // one order for all epochs
  if (epoch != order_epoch_) {
    if (options_.shuffle) {
      order_ = epoch_order(n_, options_.seed, epoch);
    } else {
      order_.resize(static_cast<size_t>(n_));
      std::iota(order_.begin(), order_.end(), int64_t{0});
    }
    order_epoch_ = epoch;
  }
  return order_;
}

Batch DataLoader::batch_at(int64_t epoch, int64_t position, int64_t size) {
  LOCKSTEP_CHECK(size > 0 && position >= 0 && position + size <= n_)
      << "DataLoader: batch of " << size << " samples at position " << position << " does not fit in " << n_
      << " samples";
  const std::vector<int64_t>& epoch_rows = order(epoch);
  Batch batch;
  batch.epoch = epoch;
  batch.first_position = position;
  batch.indices.assign(epoch_rows.begin() + position, epoch_rows.begin() + position + size);
  if (options_.shuffle) {
    batch.images = gather_rows(dataset_.images, batch.indices);
    batch.labels = gather_rows(dataset_.labels, batch.indices);
  } else {
    batch.images = row_view(dataset_.images, position, size);
    batch.labels = row_view(dataset_.labels, position, size);
  }
  return batch;
}

std::optional<Batch> DataLoader::next() {
  const int64_t take = std::min(options_.batch_size, n_ - position_.sample);
  if (take <= 0 || (options_.drop_last && take < options_.batch_size)) {
    position_ = {position_.epoch + 1, 0};
    return std::nullopt;
  }
  Batch batch = batch_at(position_.epoch, position_.sample, take);
  position_.sample += take;
  return batch;
}

void DataLoader::set_position(const LoaderPosition& position) {
  LOCKSTEP_CHECK(position.epoch >= 0 && position.sample >= 0 && position.sample <= n_)
      << "DataLoader: cannot resume at epoch " << position.epoch << ", sample " << position.sample
      << ": the dataset has " << n_ << " samples (was the checkpoint made with another dataset?)";
  position_ = position;
}

}  // namespace lockstep
