#include "lockstep/ops/cuda/cublas_handle.h"

#include <mutex>
#include <vector>

#include "lockstep/core/cuda/runtime.h"
#include "lockstep/core/error.h"
#include "lockstep/ops/cuda/cublas_library.h"

namespace lockstep::ops::cuda {
namespace {

// cuBLAS's recommended workspace on Hopper (Ampere's is 4 MiB). cuBLAS promises the same bits
// run to run only with a fixed workspace: one buffer of our own per handle, rather than its
// default pool, keeps the algorithms it picks for a shape, and so the results, the same.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

cublasHandle_t make_handle(Device device) {
  lockstep::cuda::DeviceScope scope(device);
  cublasHandle_t handle = nullptr;
  LOCKSTEP_CUBLAS_CHECK(cublas().create(&handle));
  // Stream first: cublasSetStream puts the library's default workspace back.
  LOCKSTEP_CUBLAS_CHECK(cublas().set_stream(handle, lockstep::cuda::stream(device)));
  // Never freed, like the handle: tensors (and the ops that free them) outlive statics.
  // Outside the caching allocator, so it stays out of the device's memory statistics.
  void* workspace = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));
  LOCKSTEP_CUBLAS_CHECK(cublas().set_workspace(handle, workspace, kWorkspaceBytes));
  // Full f32 products by default; TF32 is asked for per call (ops/cuda/gemm.cpp picks the
  // compute type from cuda::allow_tf32()), so no call changes the handle's state and two
  // threads queueing on one device's handle cannot race on it.
  LOCKSTEP_CUBLAS_CHECK(cublas().set_math_mode(handle, CUBLAS_DEFAULT_MATH));
  // Atomics stay off (cuBLAS's default): the routines that would use them give
  // order-dependent sums.
  LOCKSTEP_CUBLAS_CHECK(cublas().set_atomics_mode(handle, CUBLAS_ATOMICS_NOT_ALLOWED));
  return handle;
}

}  // namespace

void check_cublas(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  LOCKSTEP_FAIL() << "cuBLAS: " << call << " failed: " << cublas().status_name(status) << ": "
                  << cublas().status_string(status);
}

cublasHandle_t cublas_handle(Device device) {
  LOCKSTEP_CHECK(device.is_cuda()) << "cuBLAS handles exist for cuda devices only, not " << device;
  // Each thread keeps the handles it has seen: only its first product on a device locks.
  thread_local std::vector<cublasHandle_t> seen;
  const auto index = static_cast<size_t>(device.index());
  if (index < seen.size() && seen[index] != nullptr) return seen[index];
  static std::mutex mutex;
  static auto* handles = new std::vector<cublasHandle_t>();  // never freed: tensors outlive statics
  const int count = lockstep::cuda::device_count();
  lockstep::cuda::physical_device(device);  // throws, naming the visible devices, for a bad index
  std::lock_guard<std::mutex> lock(mutex);
  if (handles->empty()) handles->resize(static_cast<size_t>(count), nullptr);
  cublasHandle_t& handle = (*handles)[index];
  if (handle == nullptr) handle = make_handle(device);
  if (seen.size() <= index) seen.resize(index + 1, nullptr);
  seen[index] = handle;
  return handle;
}

}  // namespace lockstep::ops::cuda
