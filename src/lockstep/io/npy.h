// NumPy's .npy files (format versions 1, 2 and 3): what np.save writes. Little-endian,
// C-order arrays of float32, float64, float16, int32, int64 and uint8 load as CPU tensors;
// anything else is an Error that names the file, what it holds and how to convert it.
#pragma once

#include <string>

#include "lockstep/core/tensor.h"

namespace lockstep {

Tensor load_npy(const std::string& path);

}  // namespace lockstep
