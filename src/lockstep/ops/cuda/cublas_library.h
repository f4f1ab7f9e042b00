// cuBLAS, loaded at its first use (dlopen) instead of linked. A linked cuBLAS is mapped and
// relocated, cuBLASLt with it, when any process of the program starts: about 90 ms and 200
// MiB of memory for every `lockstep` command and test process, GPU or none. Host code only;
// includes cublas_v2.h for the types.
#pragma once

#include <cublas_v2.h>

namespace lockstep::ops::cuda {

// cublas_api.h overloads these two for C++ (an older compute-type argument), so their types
// are spelled out: the exported functions' own.
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                        const void*, const void*, cudaDataType, int, const void*, cudaDataType, int,
                                        const void*, void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
using CublasGemmStridedBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                                      int, const void*, const void*, cudaDataType, int, long long,
                                                      const void*, cudaDataType, int, long long, const void*, void*,
                                                      cudaDataType, int, long long, int, cublasComputeType_t,
                                                      cublasGemmAlgo_t);

// The entry points Lockstep calls, under cublas_v2.h's names.
struct CublasLibrary {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetWorkspace_v2) set_workspace;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSetAtomicsMode) set_atomics_mode;
  CublasGemmEx gemm_ex;
  CublasGemmStridedBatchedEx gemm_strided_batched_ex;
  decltype(&cublasDgemm_v2) dgemm;
  decltype(&cublasDgemmStridedBatched) dgemm_strided_batched;
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};

// Loads libcublas.so.<the major version built against> once; throws Error naming the
// library and the missing symbol, with what to install, when it cannot.
const CublasLibrary& cublas();

}  // namespace lockstep::ops::cuda
