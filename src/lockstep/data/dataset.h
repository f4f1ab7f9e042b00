// What a DataLoader samples from: any number of samples, each a row of every field. A user's
// data is a Dataset they implement (read from disk, decode, augment — get() is given the
// rows it must return, so the loader's one global order per (seed, epoch) applies to it), or
// a TensorDataset of tensors in memory, which the loaders (Fashion-MNIST, text windows,
// .npy and safetensors files: io/dataset_files.h) produce.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/data/tensor_batch.h"

namespace lockstep {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Rows `rows` of the dataset, in that order, as one batch (CPU tensors, contiguous).
  virtual TensorBatch get(const std::vector<int64_t>& rows) const = 0;
  // Rows [first, first + count): get() of those rows, unless a dataset can do better (a
  // TensorDataset gives views, no copy).
  virtual TensorBatch range(int64_t first, int64_t count) const;
};

// Named tensors in memory with one sample per row: {"image": [N, 1, 28, 28], "label": [N]}.
// The tensors must be on the CPU; a strided one is copied once, contiguously, up front.
class TensorDataset final : public Dataset {
 public:
  explicit TensorDataset(const TensorBatch& fields);
  TensorDataset(std::initializer_list<std::pair<std::string, Tensor>> fields) : TensorDataset(TensorBatch(fields)) {}

  int64_t size() const override { return fields_.size(); }
  TensorBatch get(const std::vector<int64_t>& rows) const override;
  TensorBatch range(int64_t first, int64_t count) const override;

  const TensorBatch& fields() const { return fields_; }
  const Tensor& operator[](const std::string& name) const { return fields_.at(name); }

 private:
  TensorBatch fields_;
};

// Copies rows[i] of `source` (axis 0, contiguous) into row i of a new contiguous tensor.
Tensor gather_rows(const Tensor& source, const std::vector<int64_t>& rows);

}  // namespace lockstep
