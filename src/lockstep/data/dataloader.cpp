#include "lockstep/data/dataloader.h"

#include <numeric>

#include "lockstep/core/philox.h"

namespace lockstep {

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

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  LOCKSTEP_CHECK(dataset_ != nullptr) << "DataLoader: no dataset given";
  n_ = dataset_->size();
  LOCKSTEP_CHECK(options_.batch_size > 0) << "DataLoader: batch size must be positive, got " << options_.batch_size;
}

DataLoader::DataLoader(const TensorDataset& dataset, DataLoaderOptions options)
    : DataLoader(std::make_shared<TensorDataset>(dataset), options) {}

DataLoader::DataLoader(const TensorBatch& fields, DataLoaderOptions options)
    : DataLoader(std::make_shared<TensorDataset>(fields), options) {}

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
  batch.samples = options_.shuffle ? dataset_->get(batch.indices) : dataset_->range(position, size);
  LOCKSTEP_CHECK(batch.samples.size() == size)
      << "DataLoader: the dataset returned " << batch.samples.size() << " samples for " << size << " rows";
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
