// safetensors files (Hugging Face's format): an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {string: string}} padded with
// spaces to 8 bytes, then the raw little-endian tensor bytes. Files we write load with the
// Python `safetensors` package and back; every defect in a file read is an Error.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/core/tensor.h"

namespace lockstep {

// Named tensors in the order they are written (and read back).
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::map<std::string, std::string>;

struct TensorFile {
  NamedTensors tensors;  // in the file's header order
  Metadata metadata;

  bool contains(const std::string& name) const;
  // The tensor called `name`; an Error listing a few names when absent.
  const Tensor& at(const std::string& name) const;
};

// Writes tensors (any device, any layout: stored contiguously, in list order) and metadata.
// Names must be unique, non-empty and not "__metadata__". Not atomic: see save_checkpoint.
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});

// Reads a whole file into CPU tensors. Accepts the dtypes F32, F64, BF16, F16, I32, I64, U8.
TensorFile load_safetensors(const std::string& path);
// Only the metadata, read from the header without the tensors' bytes.
Metadata load_safetensors_metadata(const std::string& path);

}  // namespace lockstep
