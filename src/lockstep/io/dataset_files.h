// Datasets read from files, one tensor per field with a row per sample, sampled by the
// DataLoader like any other: NumPy's .npy files (one per field), or the tensors of a
// safetensors file (named by the file).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "lockstep/data/dataset.h"

namespace lockstep {

// {{"x", "x.npy"}, {"y", "y.npy"}}: field x from x.npy, ... The files must agree on the
// sample count (their first axis); the Error names the two that do not.
TensorDataset load_npy_dataset(const std::vector<std::pair<std::string, std::string>>& fields);

// Every tensor of the file as a field under its own name, or only those in `fields`, in
// that order.
TensorDataset load_safetensors_dataset(const std::string& path, const std::vector<std::string>& fields = {});

}  // namespace lockstep
