// GEMM on a GPU: Lockstep's matmul (cuBLAS under it, through one handle per device and a
// fixed workspace) beside cuBLAS's best for the same product — the eight algorithms
// cuBLASLt's heuristic ranks first, each timed, the fastest kept — in f32 (TF32 off,
// Lockstep's default, and on) and bf16 (Lockstep's autocast: f32 tensors rounded to bf16 on
// every call, against cuBLAS on operands already in bf16), with bf16 beside the GPU's peak.
// Prints one line per shape and a "RESULT" line scripts/gpu-check reads.
//
//   build-gpu/bin/cuda_gemm [--peak-bf16 TFLOPS]   (default 989: H100/H200 SXM dense bf16)
#if LOCKSTEP_HAVE_CUDA

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "lockstep/core/autocast.h"
#include "lockstep/core/cuda_device.h"
#include "lockstep/core/tensor.h"
#include "lockstep/ops/ops.h"

namespace {

using namespace lockstep;
using Clock = std::chrono::steady_clock;

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(rc));
    std::exit(1);
  }
}
void check(cublasStatus_t rc, const char* what) {
  if (rc != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: cuBLAS status %d\n", what, static_cast<int>(rc));
    std::exit(1);
  }
}

struct Product {
  const char* name;
  int64_t m, n, k;
};

// Best seconds per call of body over a few timed batches (the first call warms up).
template <typename Body, typename Sync>
double best_seconds(const Body& body, const Sync& sync, int calls) {
  body();
  sync();
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = Clock::now();
    for (int i = 0; i < calls; ++i) body();
    sync();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count() / calls);
  }
  return best;
}

// cuBLAS's best for row-major C[m,n] = A[m,k] B[k,n], as column-major C^T = B^T A^T.
double cublas_best_seconds(cublasLtHandle_t lt, const Product& s, cudaDataType_t type, cublasComputeType_t compute,
                           const void* a, const void* b, void* c, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream, int calls) {
  cublasLtMatmulDesc_t desc = nullptr;
  check(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  // Column-major views: B^T is [n, k] with ld n, A^T is [k, m] with ld k, C^T [n, m] with ld n.
  check(cublasLtMatrixLayoutCreate(&lb, type, s.n, s.k, s.n), "layout B");
  check(cublasLtMatrixLayoutCreate(&la, type, s.k, s.m, s.k), "layout A");
  check(cublasLtMatrixLayoutCreate(&lc, type, s.n, s.m, s.n), "layout C");
  cublasLtMatmulPreference_t preference = nullptr;
  check(cublasLtMatmulPreferenceCreate(&preference), "preference");
  check(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                             sizeof workspace_bytes),
        "workspace preference");
  cublasLtMatmulHeuristicResult_t results[8] = {};
  int found = 0;
  check(cublasLtMatmulAlgoGetHeuristic(lt, desc, lb, la, lc, lc, preference, 8, results, &found), "heuristic");
  const float alpha = 1.0f, beta = 0.0f;
  double best = 1e30;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const double t = best_seconds(
        [&] {
          check(cublasLtMatmul(lt, desc, &alpha, b, lb, a, la, &beta, c, lc, c, lc, &results[i].algo, workspace,
                               workspace_bytes, stream),
                "cublasLtMatmul");
        },
        [&] { check(cudaStreamSynchronize(stream), "sync"); }, calls);
    best = std::min(best, t);
  }
  cublasLtMatmulPreferenceDestroy(preference);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  return best;
}

double tflops(const Product& s, double seconds) { return 2.0 * s.m * s.n * s.k / seconds / 1e12; }

}  // namespace

int main(int argc, char** argv) {
  double peak_bf16 = 989.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--peak-bf16") peak_bf16 = std::atof(argv[i + 1]);
  }
  if (cuda::device_count() == 0) {
    std::printf("SKIP no CUDA device is visible\n");
    return 0;
  }
  const Device device(DeviceType::cuda, 0);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cublasLtHandle_t lt = nullptr;
  check(cublasLtCreate(&lt), "cublasLtCreate");
  const size_t workspace_bytes = size_t{64} << 20;
  void* workspace = nullptr;
  check(cudaMalloc(&workspace, workspace_bytes), "workspace");

  const std::vector<Product> shapes = {{"square 4096", 4096, 4096, 4096},
                                       {"square 8192", 8192, 8192, 8192},
                                       {"mlp fc1 fwd (256x784x512)", 256, 512, 784},
                                       {"cnn fc1 fwd (256x1600x128)", 256, 128, 1600}};
  std::printf("%-28s %10s %11s %6s %10s %11s %6s %10s %11s %6s %8s\n", "shape", "f32 ours", "f32 cuBLAS", "ratio",
              "tf32 ours", "tf32 cuBLAS", "ratio", "bf16 ours", "bf16 cuBLAS", "ratio", "of peak");
  double worst_ratio = 1e30, worst_tf32_ratio = 1e30, worst_bf16_ratio = 1e30, best_bf16 = 0;
  for (const Product& s : shapes) {
    const int calls = s.m * s.n * s.k >= (int64_t{1} << 33) ? 5 : 50;
    const Tensor a = Tensor::full({s.m, s.k}, 0.01, DType::f32, device);
    const Tensor b = Tensor::full({s.k, s.n}, 0.02, DType::f32, device);
    const auto sync = [&] { cuda::synchronize(device); };
    cuda::set_allow_tf32(false);
    const double ours = best_seconds([&] { matmul(a, b); }, sync, calls);
    cuda::set_allow_tf32(true);
    const double ours_tf32 = best_seconds([&] { matmul(a, b); }, sync, calls);
    cuda::set_allow_tf32(false);
    double ours_bf16 = 0;
    {
      const AutocastGuard autocast(DType::bf16);
      ours_bf16 = best_seconds([&] { matmul(a, b); }, sync, calls);
    }
    const Tensor c = Tensor::empty({s.m, s.n}, DType::f32, device);
    const double theirs = cublas_best_seconds(lt, s, CUDA_R_32F, CUBLAS_COMPUTE_32F, a.data_ptr(), b.data_ptr(),
                                              c.data_ptr(), workspace, workspace_bytes, stream, calls);
    const double theirs_tf32 =
        cublas_best_seconds(lt, s, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, a.data_ptr(), b.data_ptr(), c.data_ptr(),
                            workspace, workspace_bytes, stream, calls);
    const Tensor a16 = a.to(DType::bf16), b16 = b.to(DType::bf16), c16 = c.to(DType::bf16);
    const double bf16 = cublas_best_seconds(lt, s, CUDA_R_16BF, CUBLAS_COMPUTE_32F, a16.data_ptr(), b16.data_ptr(),
                                            c16.data_ptr(), workspace, workspace_bytes, stream, calls);
    const double ratio = theirs / ours, ratio_tf32 = theirs_tf32 / ours_tf32, ratio_bf16 = bf16 / ours_bf16;
    worst_ratio = std::min(worst_ratio, ratio);
    worst_tf32_ratio = std::min(worst_tf32_ratio, ratio_tf32);
    worst_bf16_ratio = std::min(worst_bf16_ratio, ratio_bf16);
    best_bf16 = std::max(best_bf16, tflops(s, bf16));
    std::printf("%-28s %10.1f %11.1f %5.2fx %10.1f %11.1f %5.2fx %10.1f %11.1f %5.2fx %7.1f%%\n", s.name,
                tflops(s, ours), tflops(s, theirs), ratio, tflops(s, ours_tf32), tflops(s, theirs_tf32), ratio_tf32,
                tflops(s, ours_bf16), tflops(s, bf16), ratio_bf16, 100.0 * tflops(s, bf16) / peak_bf16);
  }
  std::printf("(TFLOP/s; ratio = ours / cuBLAS's best as speed, 1.00x = as fast)\n");
  std::printf(
      "RESULT gemm_f32_worst_ratio=%.3f gemm_tf32_worst_ratio=%.3f gemm_bf16_worst_ratio=%.3f bf16_best_tflops=%.1f "
      "bf16_peak=%.0f\n",
      worst_ratio, worst_tf32_ratio, worst_bf16_ratio, best_bf16, peak_bf16);
  cudaFree(workspace);
  cublasLtDestroy(lt);
  cudaStreamDestroy(stream);
  return 0;
}

#else

#include <cstdio>

int main() {
  std::printf("SKIP this build has no CUDA backend\n");
  return 0;
}

#endif
