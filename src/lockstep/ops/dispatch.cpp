#include "lockstep/ops/dispatch.h"

#include "lockstep/core/cuda_device.h"

namespace lockstep::ops {

Device common_device(const char* op, std::initializer_list<Tensor> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (first == nullptr) {
      first = &t;
    } else {
      LOCKSTEP_CHECK(t.device() == first->device()) << op << ": inputs are on different devices (" << first->device()
                                                    << " and " << t.device() << "); move them with .to(device)";
    }
  }
  LOCKSTEP_CHECK(first != nullptr) << op << ": no defined input";
  return first->device();
}

void require_cpu(const char* op, Device device) {
  LOCKSTEP_CHECK(device.is_cpu()) << op << " has no kernel for " << device << " in this build";
}

void require_device(const char* op, Device device) {
  LOCKSTEP_CHECK(device.is_cpu() || (device.is_cuda() && cuda::built()))
      << op << " has no kernel for " << device
      << " in this build: it was built without the CUDA backend (built when nvcc and NCCL are found)";
}

void require_float(const char* op, const Tensor& t) {
  LOCKSTEP_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64)
      << op << ": dtype " << dtype_name(t.dtype()) << " is not supported, convert to f32 or f64 first";
}

}  // namespace lockstep::ops
