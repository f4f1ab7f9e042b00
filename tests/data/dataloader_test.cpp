#include "lockstep/data/dataloader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "lockstep/core/philox.h"

namespace lockstep {
namespace {

// n samples whose image rows hold (row * 100 + k) and whose labels hold row * 3, so every
// gathered value says which row it came from.
struct Numbered {
  Tensor images, labels;
  TensorBatch fields() const { return {{"images", images}, {"labels", labels}}; }
};

Numbered numbered_dataset(int64_t n, int64_t row_values = 6) {
  Numbered d;
  d.images = Tensor::empty({n, 2, row_values / 2}, DType::f32);
  d.labels = Tensor::empty({n}, DType::i64);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t k = 0; k < row_values; ++k)
      d.images.data<float>()[r * row_values + k] = static_cast<float>(r * 100 + k);
    d.labels.data<int64_t>()[r] = r * 3;
  }
  return d;
}

void expect_batch_holds_rows(const Batch& batch, int64_t row_values = 6) {
  ASSERT_EQ(batch.samples.size(), batch.size());
  const std::vector<float> images = batch.samples["images"].to_vector<float>();
  const std::vector<int64_t> labels = batch.samples["labels"].to_vector<int64_t>();
  for (int64_t i = 0; i < batch.size(); ++i) {
    const int64_t row = batch.indices[static_cast<size_t>(i)];
    EXPECT_EQ(labels[static_cast<size_t>(i)], row * 3);
    for (int64_t k = 0; k < row_values; ++k)
      ASSERT_EQ(images[static_cast<size_t>(i * row_values + k)], static_cast<float>(row * 100 + k));
  }
}

bool is_permutation_of_range(std::vector<int64_t> order) {
  std::sort(order.begin(), order.end());
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

TEST(EpochOrder, IsAPermutationFixedBySeedAndEpoch) {
  const std::vector<int64_t> a = epoch_order(1000, 42, 3);
  EXPECT_EQ(a.size(), 1000u);
  EXPECT_TRUE(is_permutation_of_range(a));
  EXPECT_EQ(a, epoch_order(1000, 42, 3));
  EXPECT_NE(a, epoch_order(1000, 42, 4));
  EXPECT_NE(a, epoch_order(1000, 43, 3));
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_NE(a, identity);
  EXPECT_TRUE(epoch_order(0, 1, 0).empty());
  EXPECT_EQ(epoch_order(1, 1, 0), (std::vector<int64_t>{0}));
  EXPECT_THROW(epoch_order(-1, 1, 0), Error);
  EXPECT_THROW(epoch_order(10, 1, -1), Error);
}

// The documented contract, written out: a sampler in another language can reproduce it.
TEST(EpochOrder, FollowsTheDocumentedFisherYates) {
  const int64_t n = 37, epoch = 5;
  const uint64_t seed = 2024;
  std::vector<int64_t> expected(n);
  std::iota(expected.begin(), expected.end(), int64_t{0});
  Philox rng(seed, static_cast<uint64_t>(RngStream::shuffle), static_cast<uint64_t>(epoch) << 40);
  for (int64_t i = n - 1; i >= 1; --i) {
    std::swap(expected[static_cast<size_t>(i)], expected[rng.next_below(static_cast<uint64_t>(i) + 1)]);
  }
  EXPECT_EQ(epoch_order(n, seed, epoch), expected);
}

// Each of the 24 orders of 4 samples appears about equally often across epochs: an
// off-by-one in the shuffle (say, j drawn from [0, n)) skews these counts far past chance.
TEST(EpochOrder, AllOrdersAreEquallyLikely) {
  std::map<std::vector<int64_t>, int> counts;
  const int epochs = 4800;
  for (int e = 0; e < epochs; ++e) ++counts[epoch_order(4, 7, e)];
  ASSERT_EQ(counts.size(), 24u);
  for (const auto& [order, count] : counts) {
    EXPECT_GT(count, 200 - 60);  // expected 200, sd ~14
    EXPECT_LT(count, 200 + 60);
  }
}

TEST(DataLoader, ShuffledEpochCoversEverySampleOnce) {
  DataLoader loader(numbered_dataset(10).fields(), {.batch_size = 3, .shuffle = true, .seed = 9});
  EXPECT_EQ(loader.batches_per_epoch(), 4);
  std::vector<int64_t> seen;
  std::vector<int64_t> sizes;
  while (auto batch = loader.next()) {
    EXPECT_EQ(batch->epoch, 0);
    EXPECT_EQ(batch->first_position, static_cast<int64_t>(seen.size()));
    expect_batch_holds_rows(*batch);
    EXPECT_TRUE(batch->samples["images"].is_contiguous());
    sizes.push_back(batch->size());
    seen.insert(seen.end(), batch->indices.begin(), batch->indices.end());
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(seen, epoch_order(10, 9, 0));  // in the epoch's order, each once
  EXPECT_TRUE(is_permutation_of_range(seen));
  EXPECT_EQ(loader.position(), (LoaderPosition{1, 0}));

  // The next epoch has another order.
  std::vector<int64_t> second;
  while (auto batch = loader.next()) second.insert(second.end(), batch->indices.begin(), batch->indices.end());
  EXPECT_EQ(second, epoch_order(10, 9, 1));
  EXPECT_NE(second, seen);
}

TEST(DataLoader, DropLastSkipsTheShortBatch) {
  DataLoader loader(numbered_dataset(10).fields(), {.batch_size = 4, .shuffle = true, .seed = 1, .drop_last = true});
  EXPECT_EQ(loader.batches_per_epoch(), 2);
  int batches = 0;
  while (auto batch = loader.next()) {
    EXPECT_EQ(batch->size(), 4);
    ++batches;
  }
  EXPECT_EQ(batches, 2);
  EXPECT_EQ(loader.position(), (LoaderPosition{1, 0}));
}

TEST(DataLoader, RestoredPositionResumesAtTheNextBatch) {
  const TensorBatch data = numbered_dataset(23).fields();
  const DataLoaderOptions options{.batch_size = 4, .shuffle = true, .seed = 77};
  DataLoader first(data, options);
  std::vector<std::vector<int64_t>> reference;  // epochs 0 and 1, batch by batch
  for (int epoch = 0; epoch < 2; ++epoch) {
    while (auto batch = first.next()) reference.push_back(batch->indices);
  }
  ASSERT_EQ(reference.size(), 12u);

  // Stop after batch 2 of epoch 1, save, and resume in a fresh loader.
  DataLoader interrupted(data, options);
  for (int i = 0; i < 6 + 2; ++i) {
    if (!interrupted.next()) interrupted.next();
  }
  const LoaderPosition saved = interrupted.position();
  EXPECT_EQ(saved, (LoaderPosition{1, 8}));
  DataLoader resumed(data, options);
  resumed.set_position(saved);
  for (size_t b = 8; b < reference.size(); ++b) {
    const auto batch = resumed.next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(batch->indices, reference[b]) << "batch " << b;
    EXPECT_EQ(batch->epoch, 1);
    expect_batch_holds_rows(*batch);
  }
  EXPECT_FALSE(resumed.next().has_value());

  EXPECT_THROW(resumed.set_position({0, 24}), Error);
  EXPECT_THROW(resumed.set_position({-1, 0}), Error);
  resumed.set_position({3, 23});  // an epoch's end is a valid place to stop
  EXPECT_FALSE(resumed.next().has_value());
  EXPECT_EQ(resumed.position(), (LoaderPosition{4, 0}));
}

TEST(DataLoader, UnshuffledBatchesAreViewsOfTheDataset) {
  const Numbered data = numbered_dataset(7);
  DataLoader loader(data.fields(), {.batch_size = 3, .shuffle = false});
  std::vector<int64_t> seen;
  while (auto batch = loader.next()) {
    EXPECT_EQ(batch->samples["images"].storage(), data.images.storage());
    EXPECT_EQ(batch->samples["labels"].storage(), data.labels.storage());
    EXPECT_EQ(batch->samples["images"].shape(), (Shape{batch->size(), 2, 3}));
    expect_batch_holds_rows(*batch);
    seen.insert(seen.end(), batch->indices.begin(), batch->indices.end());
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));

  // A write to the dataset shows through the batch: no copy was made.
  const Batch middle = loader.batch_at(0, 3, 3);
  data.images.data<float>()[3 * 6] = -1.0f;
  EXPECT_EQ(middle.samples["images"].to_vector<float>()[0], -1.0f);
  EXPECT_EQ(middle.first_position, 3);
}

TEST(DataLoader, StridedDatasetIsGatheredCorrectly) {
  // Images stored transposed ([n, 6] viewed from a [6, n] buffer): the loader compacts them.
  const int64_t n = 5;
  Tensor storage = Tensor::empty({6, n}, DType::f32);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t k = 0; k < 6; ++k) storage.data<float>()[k * n + r] = static_cast<float>(r * 100 + k);
  Numbered data = numbered_dataset(n);
  data.images = storage.as_strided({n, 6}, {1, n}, 0);
  DataLoader loader(data.fields(), {.batch_size = 2, .shuffle = true, .seed = 3});
  while (auto batch = loader.next()) expect_batch_holds_rows(*batch);
}

TEST(DataLoader, GatherRowsCopiesWholeRows) {
  const Numbered data = numbered_dataset(120, 8192);  // 3 MB gathered: enough to split across threads
  std::vector<int64_t> rows(97);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>((i * 53) % 120);
  Batch batch;
  batch.indices = rows;
  batch.samples = TensorDataset(data.fields()).get(rows);
  expect_batch_holds_rows(batch, 8192);
  EXPECT_THROW(gather_rows(data.labels, {120}), Error);
}

TEST(DataLoader, RejectsBadInput) {
  Numbered mismatched = numbered_dataset(4);
  mismatched.labels = Tensor::zeros({5}, DType::i64);
  EXPECT_THROW(DataLoader(mismatched.fields(), {}), Error);
  EXPECT_THROW(DataLoader(numbered_dataset(4).fields(), {.batch_size = 0}), Error);
  EXPECT_THROW(DataLoader(std::shared_ptr<const Dataset>(), {}), Error);
  DataLoader loader(numbered_dataset(4).fields(), {.batch_size = 2});
  EXPECT_THROW(loader.batch_at(0, 3, 2), Error);
}

// A dataset the user implements: samples made on demand (here from their index), sampled in
// the same global order per (seed, epoch) as tensors in memory.
class ComputedDataset final : public Dataset {
 public:
  int64_t size() const override { return 23; }
  TensorBatch get(const std::vector<int64_t>& rows) const override {
    ++gets;
    const Numbered all = numbered_dataset(size());
    return TensorDataset(all.fields()).get(rows);
  }
  mutable int gets = 0;
};

TEST(DataLoader, AUserDatasetIsSampledInTheSameGlobalOrder) {
  const auto computed = std::make_shared<ComputedDataset>();
  const DataLoaderOptions options{.batch_size = 5, .shuffle = true, .seed = 4};
  DataLoader theirs(computed, options);
  DataLoader in_memory(numbered_dataset(23).fields(), options);
  for (int b = 0; b < 6; ++b) {  // across an epoch boundary
    auto batch = theirs.next();
    auto reference = in_memory.next();
    ASSERT_EQ(batch.has_value(), reference.has_value());
    if (!batch) continue;
    EXPECT_EQ(batch->indices, reference->indices);
    expect_batch_holds_rows(*batch);
  }
  EXPECT_EQ(computed->gets, 5);
}

}  // namespace
}  // namespace lockstep
