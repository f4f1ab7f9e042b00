// Batches over a Dataset in an order fixed by (seed, epoch). Each epoch's order is one global
// permutation, the same however many devices later share it (a sampler cuts it into
// shards), and the loader's position is two integers a checkpoint saves to resume exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "lockstep/data/dataset.h"

namespace lockstep {

// The order of n samples in epoch `epoch`: Fisher-Yates over [0, n) drawing
// j = next_below(i + 1) for i = n-1 down to 1 from Philox(seed, RngStream::shuffle,
// counter = epoch << 40) — each epoch owns 2^40 counter blocks, far more than a shuffle uses.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch);

struct DataLoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;  // drop the final batch when it is smaller than batch_size
};

// Where the loader stands: the next batch starts at `sample` in epoch `epoch`'s order.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t sample = 0;
  friend bool operator==(const LoaderPosition&, const LoaderPosition&) = default;
};

struct Batch {
  TensorBatch samples;  // the dataset's fields, one row per sample, contiguous
  int64_t epoch = 0;
  int64_t first_position = 0;    // index in the epoch order of the first sample (dropout keys)
  std::vector<int64_t> indices;  // the dataset rows, in batch order
  int64_t size() const { return static_cast<int64_t>(indices.size()); }
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  // Over tensors in memory (a TensorDataset of them; copies share the tensors).
  DataLoader(const TensorDataset& dataset, DataLoaderOptions options);
  DataLoader(const TensorBatch& fields, DataLoaderOptions options);

  // The next batch of the current epoch, or nullopt when the epoch is done; then the
  // position moves to the start of the next epoch, so `while (auto b = loader.next())`
  // runs one epoch.
  std::optional<Batch> next();

  // The batch of `size` samples starting at `position` in epoch `epoch`'s order (no effect
  // on the loader's position). Without shuffling it is the dataset's range() of rows (a
  // view, for a TensorDataset), else its get() of the epoch order's rows.
  Batch batch_at(int64_t epoch, int64_t position, int64_t size);

  LoaderPosition position() const { return position_; }
  // Resumes at a saved position; checked against the dataset size.
  void set_position(const LoaderPosition& position);

  // The order of epoch `epoch` (identity without shuffle); cached for the current epoch.
  const std::vector<int64_t>& order(int64_t epoch);

  int64_t num_samples() const { return n_; }
  int64_t batches_per_epoch() const;
  const DataLoaderOptions& options() const { return options_; }
  const Dataset& dataset() const { return *dataset_; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  int64_t n_ = 0;
  LoaderPosition position_;
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;
};

}  // namespace lockstep
