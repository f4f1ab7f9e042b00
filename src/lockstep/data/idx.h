// IDX files, the format of MNIST and Fashion-MNIST: a magic word (two zero bytes, a type
// code, the rank), big-endian 32-bit dimensions, then the big-endian payload. Files may be
// gzip-compressed; anything wrong with one is an Error naming the file and the problem.
#pragma once

#include <string>

#include "lockstep/core/tensor.h"

namespace lockstep {

// Reads an IDX file, gzip-compressed or plain (detected from the bytes, not the name), into
// a CPU tensor whose shape is the file's dimensions. Type codes map to dtypes: 0x08 unsigned
// byte -> u8, 0x09 signed byte and 0x0B short -> i32 (widened), 0x0C int -> i32, 0x0D float
// -> f32, 0x0E double -> f64. Trailing bytes after the payload are an error too: they mean
// the dimensions do not describe the file.
Tensor read_idx(const std::string& path);

}  // namespace lockstep
