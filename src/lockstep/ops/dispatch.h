// How an op picks its kernel: by the device of its inputs. Every op checks that its inputs
// share one device, then calls ops/cpu/ (or, in CUDA builds, ops/cuda/) kernels.
#pragma once

#include <initializer_list>

#include "lockstep/core/tensor.h"

namespace lockstep::ops {

// The common device of the defined tensors; throws Error naming the op and both devices
// when they differ.
Device common_device(const char* op, std::initializer_list<Tensor> tensors);

// Throws Error for ops that have no kernel on this device yet.
void require_cpu(const char* op, Device device);

// Throws Error unless this build has op's kernels for device: CPU devices always, CUDA
// devices in builds with the CUDA backend (ops/cuda/). Ops with both kinds call this.
void require_device(const char* op, Device device);

// Throws Error unless the dtype is f32 or f64 (the compute dtypes).
void require_float(const char* op, const Tensor& t);

// Calls body.template operator()<T>() with T = float or double, matching dtype.
template <typename Body>
void dispatch_float(const char* op, DType dtype, Body&& body) {
  if (dtype == DType::f32) {
    body.template operator()<float>();
  } else if (dtype == DType::f64) {
    body.template operator()<double>();
  } else {
    LOCKSTEP_FAIL() << op << ": dtype " << dtype_name(dtype) << " is not supported, convert to f32 or f64 first";
  }
}

// Calls body.template operator()<I>() with I = int32_t or int64_t, matching an index or label
// dtype (i32 or i64).
template <typename Body>
void dispatch_index(const char* op, DType dtype, Body&& body) {
  if (dtype == DType::i64) {
    body.template operator()<int64_t>();
  } else if (dtype == DType::i32) {
    body.template operator()<int32_t>();
  } else {
    LOCKSTEP_FAIL() << op << ": dtype " << dtype_name(dtype) << " is not an index dtype, convert to i64 or i32 first";
  }
}

}  // namespace lockstep::ops
