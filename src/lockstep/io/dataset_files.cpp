#include "lockstep/io/dataset_files.h"

#include "lockstep/io/npy.h"
#include "lockstep/io/safetensors.h"

namespace lockstep {
namespace {

// The fields as one dataset; a mismatch of sample counts names the files.
TensorDataset dataset_of(const NamedTensors& fields, const std::vector<std::string>& sources) {
  for (size_t i = 0; i < fields.size(); ++i) {
    const Tensor& tensor = fields[i].second;
    LOCKSTEP_CHECK(tensor.dim() >= 1) << sources[i] << ": field '" << fields[i].first
                                      << "' is a scalar; a dataset's fields need a sample axis first";
    LOCKSTEP_CHECK(tensor.size(0) == fields[0].second.size(0))
        << sources[i] << ": field '" << fields[i].first << "' " << shape_str(tensor.shape()) << " has "
        << tensor.size(0) << " samples, but " << sources[0] << ": '" << fields[0].first << "' "
        << shape_str(fields[0].second.shape()) << " has " << fields[0].second.size(0)
        << "; every field needs one row per sample";
  }
  return TensorDataset(TensorBatch(fields));
}

}  // namespace

TensorDataset load_npy_dataset(const std::vector<std::pair<std::string, std::string>>& fields) {
  LOCKSTEP_CHECK(!fields.empty()) << "load_npy_dataset: give at least one (field, file.npy)";
  NamedTensors tensors;
  std::vector<std::string> sources;
  for (const auto& [name, path] : fields) {
    tensors.emplace_back(name, load_npy(path));
    sources.push_back(path);
  }
  return dataset_of(tensors, sources);
}

TensorDataset load_safetensors_dataset(const std::string& path, const std::vector<std::string>& fields) {
  const TensorFile file = load_safetensors(path);
  NamedTensors tensors;
  if (fields.empty()) {
    tensors = file.tensors;
  } else {
    for (const std::string& name : fields) tensors.emplace_back(name, file.at(name));
  }
  LOCKSTEP_CHECK(!tensors.empty()) << path << " holds no tensors";
  return dataset_of(tensors, std::vector<std::string>(tensors.size(), path));
}

}  // namespace lockstep
