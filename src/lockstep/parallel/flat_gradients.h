// A model's gradients as one flat buffer, parameters in reverse order: the order backward
// produces them, so the buffer fills from the front and a bucket is a contiguous range.
// Data parallelism folds and all-reduces flat buffers (one call, not one per parameter) and
// hands the parameters views of the result as their .grad.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/core/tensor.h"

namespace lockstep::parallel {

class FlatGradients {
 public:
  // The parameters must share one dtype and device; the error names the first that does not.
  // Buffers are padded with zeros to a multiple of `shards` elements, so they cut into equal
  // shards (ZeRO).
  explicit FlatGradients(std::vector<Tensor> params, int shards = 1);

  int64_t numel() const { return numel_; }          // the parameters' elements
  int64_t padded_numel() const { return padded_; }  // a buffer's elements
  const std::vector<Tensor>& params() const { return params_; }
  // Where parameter i (in the order given) starts in the buffer.
  int64_t offset(size_t i) const { return offsets_[i]; }
  Tensor empty_buffer() const;

  // Moves parameter i's .grad into its place in `flat` (zeros if it has none) and clears it.
  void take(size_t i, const Tensor& flat) const;
  // Sets every parameter's .grad to its view of `flat`.
  void give(const Tensor& flat) const;
  // Parameter i's view of a buffer.
  Tensor view(const Tensor& flat, size_t i) const;
  // A new buffer holding the parameters' values.
  Tensor gather_values() const;

 private:
  std::vector<Tensor> params_;
  std::vector<int64_t> offsets_;
  int64_t numel_ = 0;
  int64_t padded_ = 0;
};

}  // namespace lockstep::parallel
