// A model's gradients as one flat buffer, parameters in reverse order: the order backward
// produces them, so the buffer fills from the front and a bucket is a contiguous range.
// Data parallelism folds and all-reduces flat buffers (one call, not one per parameter) and
// hands the parameters views of the result as their .grad.
//
// The buffer is cut into units: runs of consecutive parameters (in that order), each padded
// with zeros to a multiple of `shards` elements, so every unit cuts into equal shards on its
// own. ZeRO gives rank r the r-th shard of every unit, and distributed data parallelism's
// buckets are the units, so a bucket can be reduce-scattered the moment backward finishes it.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/core/tensor.h"

namespace lockstep::parallel {

struct FlatUnit {
  int64_t begin = 0, end = 0;  // elements of the buffer, padding included
  int64_t params_end = 0;      // the parameters' elements end here; [params_end, end) is padding
  std::vector<size_t> params;  // in buffer order: decreasing parameter indices
  int64_t shard_size(int shards) const { return (end - begin) / shards; }
};

class FlatGradients {
 public:
  // The parameters must share one dtype and device; the error names the first that does not.
  // unit_sizes: how many parameters each unit holds, in buffer order (the last parameter
  // first), summing to params.size(); empty: one unit of them all.
  explicit FlatGradients(std::vector<Tensor> params, int shards = 1, const std::vector<size_t>& unit_sizes = {});

  int64_t numel() const { return numel_; }          // the parameters' elements
  int64_t padded_numel() const { return padded_; }  // a buffer's elements
  int shards() const { return shards_; }
  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<FlatUnit>& units() const { return units_; }
  // Where parameter i (in the order given) starts in the buffer.
  int64_t offset(size_t i) const { return offsets_[i]; }
  // A buffer whose padding is zero (the parameters' places are not initialized).
  Tensor empty_buffer() const;
  // Zeros the padding of every unit of `flat`.
  void zero_padding(const Tensor& flat) const;

  // Moves parameter i's .grad into its place in `flat` (zeros if it has none) and clears it;
  // `flat` may be a part of a buffer starting at element `begin`, as for view().
  void take(size_t i, const Tensor& flat, int64_t begin = 0) const;
  // Sets every parameter's .grad to its view of `flat`.
  void give(const Tensor& flat) const;
  // Parameter i's view of a buffer. `flat` may also be one unit's part of a buffer, given
  // with where that part starts (`begin`).
  Tensor view(const Tensor& flat, size_t i, int64_t begin = 0) const;
  // A new buffer holding the parameters' values.
  Tensor gather_values() const;

 private:
  std::vector<Tensor> params_;
  std::vector<int64_t> offsets_;
  std::vector<FlatUnit> units_;
  int shards_ = 1;
  int64_t numel_ = 0;
  int64_t padded_ = 0;
};

}  // namespace lockstep::parallel
