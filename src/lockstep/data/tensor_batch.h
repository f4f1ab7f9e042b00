// A batch as a user's model needs it: named tensors of any count and dtype whose first axis
// is the sample axis (row i of every field belongs to sample i). The parallel layouts cut
// micro-batches and device shares from it along that axis and never look at the names; a
// loss function (parallel/loss_function.h) reads the fields it knows.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/core/tensor.h"
#include "lockstep/nn/named_tensors.h"

namespace lockstep {

class TensorBatch {
 public:
  TensorBatch() = default;
  // Every field must have at least one axis, and all the same number of rows; names must be
  // non-empty and distinct. Errors name the field and its shape.
  explicit TensorBatch(NamedTensors fields);
  TensorBatch(std::initializer_list<std::pair<std::string, Tensor>> fields)
      : TensorBatch(NamedTensors(fields.begin(), fields.end())) {}

  // Samples: the length of every field's first axis (0 for a batch with no fields).
  int64_t size() const { return size_; }
  bool contains(const std::string& name) const;
  // The field called `name`; an Error lists the fields there are.
  const Tensor& at(const std::string& name) const;
  const Tensor& operator[](const std::string& name) const { return at(name); }
  const NamedTensors& fields() const { return fields_; }

  // Rows [first, first + count) of every field, as views.
  TensorBatch slice(int64_t first, int64_t count) const;
  // Every field on `device` (a field already there is not copied).
  TensorBatch to(Device device) const;

 private:
  NamedTensors fields_;
  int64_t size_ = 0;
};

}  // namespace lockstep
