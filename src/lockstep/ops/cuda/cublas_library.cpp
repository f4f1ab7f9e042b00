#include "lockstep/ops/cuda/cublas_library.h"

#include <dlfcn.h>

#include <string>

#include "lockstep/core/error.h"

namespace lockstep::ops::cuda {
namespace {

const std::string kLibrary = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);

template <typename Function>
void find(void* library, const char* name, Function& out) {
  out = reinterpret_cast<Function>(dlsym(library, name));
  LOCKSTEP_CHECK(out != nullptr) << kLibrary << " has no " << name << ": this build needs cuBLAS " << CUBLAS_VER_MAJOR
                                 << "." << CUBLAS_VER_MINOR << " or newer";
}

CublasLibrary load() {
  void* library = dlopen(kLibrary.c_str(), RTLD_NOW | RTLD_LOCAL);  // never closed: used until exit
  LOCKSTEP_CHECK(library != nullptr) << "cannot load " << kLibrary << " (" << dlerror()
                                     << "): GEMMs on GPUs need the CUDA toolkit's cuBLAS, or PyTorch's "
                                        "nvidia-cublas wheel, on the library path (LD_LIBRARY_PATH)";
  CublasLibrary api{};
  find(library, "cublasCreate_v2", api.create);
  find(library, "cublasSetStream_v2", api.set_stream);
  find(library, "cublasSetWorkspace_v2", api.set_workspace);
  find(library, "cublasSetMathMode", api.set_math_mode);
  find(library, "cublasSetAtomicsMode", api.set_atomics_mode);
  find(library, "cublasGemmEx", api.gemm_ex);
  find(library, "cublasGemmStridedBatchedEx", api.gemm_strided_batched_ex);
  find(library, "cublasDgemm_v2", api.dgemm);
  find(library, "cublasDgemmStridedBatched", api.dgemm_strided_batched);
  find(library, "cublasGetStatusName", api.status_name);
  find(library, "cublasGetStatusString", api.status_string);
  return api;
}

}  // namespace

const CublasLibrary& cublas() {
  static const CublasLibrary api = load();  // thread-safe once; a failure is retried next time
  return api;
}

}  // namespace lockstep::ops::cuda
