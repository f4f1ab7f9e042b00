#include "lockstep/data/tensor_batch.h"

#include <sstream>

#include "lockstep/ops/shape_ops.h"

namespace lockstep {
namespace {

std::string field_names(const NamedTensors& fields) {
  std::string names;
  for (const auto& [name, tensor] : fields) names += (names.empty() ? "" : ", ") + ("'" + name + "'");
  return names.empty() ? "none" : names;
}

}  // namespace

TensorBatch::TensorBatch(NamedTensors fields) : fields_(std::move(fields)) {
  for (size_t i = 0; i < fields_.size(); ++i) {
    const auto& [name, tensor] = fields_[i];
    LOCKSTEP_CHECK(!name.empty()) << "batch field " << i << " has an empty name: name every field";
    for (size_t j = 0; j < i; ++j)
      LOCKSTEP_CHECK(fields_[j].first != name) << "the batch has two fields named '" << name << "'";
    LOCKSTEP_CHECK(tensor.defined()) << "batch field '" << name << "' holds no tensor";
    LOCKSTEP_CHECK(tensor.dim() >= 1) << "batch field '" << name << "' is a 0-d tensor: every field needs the "
                                      << "sample axis first (shape [samples, ...]); reshape a scalar to [1]";
    if (i == 0) size_ = tensor.size(0);
    LOCKSTEP_CHECK(tensor.size(0) == size_)
        << "batch field '" << name << "' " << shape_str(tensor.shape()) << " has " << tensor.size(0)
        << " samples on its first axis, but '" << fields_[0].first << "' " << shape_str(fields_[0].second.shape())
        << " has " << size_ << ": every field holds one row per sample";
  }
}

bool TensorBatch::contains(const std::string& name) const {
  for (const auto& field : fields_) {
    if (field.first == name) return true;
  }
  return false;
}

const Tensor& TensorBatch::at(const std::string& name) const {
  for (const auto& field : fields_) {
    if (field.first == name) return field.second;
  }
  throw Error("the batch has no field '" + name + "'; its fields: " + field_names(fields_));
}

TensorBatch TensorBatch::slice(int64_t first, int64_t count) const {
  LOCKSTEP_CHECK(first >= 0 && count >= 0 && first + count <= size_)
      << "samples [" << first << ", " << first + count << ") are outside a batch of " << size_;
  TensorBatch out;
  out.size_ = count;
  for (const auto& [name, tensor] : fields_)
    out.fields_.emplace_back(name, lockstep::slice(tensor, 0, first, first + count));
  return out;
}

TensorBatch TensorBatch::to(Device device) const {
  TensorBatch out;
  out.size_ = size_;
  for (const auto& [name, tensor] : fields_) out.fields_.emplace_back(name, tensor.to(device));
  return out;
}

}  // namespace lockstep
