#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "lockstep/core/cuda/check.h"
#include "lockstep/ops/cuda/norm_kernels.h"
#include "lockstep/ops/cuda/row_reduce.cuh"

namespace lockstep::ops::cuda {
namespace {

// The parameter gradients: a block covers kTileColumns columns of one chunk of rows, its
// kRowLanes rows of threads taking every kRowLanes-th row of the chunk.
constexpr int kTileColumns = 32;
constexpr int kRowLanes = kRowBlock / kTileColumns;
// Chunks hold at least kMinChunkRows rows and there are at most kMaxChunks of them: enough
// blocks to fill a GPU, and a partials buffer that stays small. Both depend on rows alone.
constexpr int64_t kMinChunkRows = 64;
constexpr int64_t kMaxChunks = 512;

// kGroup threads per row (a warp or the block).
template <typename T, int kGroup>
__global__ void __launch_bounds__(kRowBlock)
    layer_norm_forward_kernel(const T* x, const T* w, const T* b, T* y, double* mean, double* rstd, int64_t rows,
                              int64_t dim, double eps) {
  __shared__ double scratch[kWarpsPerRowBlock];
  for_each_row<kGroup>(rows, [&](int64_t row, int lane) {
    const T* xr = x + row * dim;
    T* yr = y + row * dim;
    double s = 0;
    for (int64_t j = lane; j < dim; j += kGroup) s += static_cast<double>(xr[j]);
    const double m = group_reduce<kGroup>(s, Sum(), scratch) / static_cast<double>(dim);
    double q = 0;
    for (int64_t j = lane; j < dim; j += kGroup) q += (xr[j] - m) * (xr[j] - m);
    const double sd = 1.0 / sqrt(group_reduce<kGroup>(q, Sum(), scratch) / static_cast<double>(dim) + eps);
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = sd;
    }
    for (int64_t j = lane; j < dim; j += kGroup) {
      double v = (xr[j] - m) * sd;
      if (w != nullptr) v *= w[j];
      if (b != nullptr) v += b[j];
      yr[j] = static_cast<T>(v);
    }
  });
}

template <typename T, int kGroup>
__global__ void __launch_bounds__(kRowBlock)
    layer_norm_backward_input_kernel(const T* x, const T* w, const T* dy, const double* mean, const double* rstd, T* dx,
                                     int64_t rows, int64_t dim) {
  __shared__ double scratch[kWarpsPerRowBlock];
  for_each_row<kGroup>(rows, [&](int64_t row, int lane) {
    const T* xr = x + row * dim;
    const T* gr = dy + row * dim;
    const double m = mean[row], sd = rstd[row];
    auto g_at = [gr, w](int64_t j) { return w != nullptr ? gr[j] * static_cast<double>(w[j]) : gr[j]; };
    double sum_g = 0, sum_gx = 0;
    for (int64_t j = lane; j < dim; j += kGroup) {
      const double g = g_at(j);
      sum_g += g;
      sum_gx += g * (xr[j] - m) * sd;
    }
    const double a = group_reduce<kGroup>(sum_g, Sum(), scratch) / static_cast<double>(dim);
    const double c = group_reduce<kGroup>(sum_gx, Sum(), scratch) / static_cast<double>(dim);
    T* dxr = dx + row * dim;
    for (int64_t j = lane; j < dim; j += kGroup) dxr[j] = static_cast<T>(sd * (g_at(j) - a - (xr[j] - m) * sd * c));
  });
}

int64_t rows_per_chunk(int64_t rows) {
  const int64_t even = (rows + kMaxChunks - 1) / kMaxChunks;
  return even > kMinChunkRows ? even : kMinChunkRows;
}

int64_t chunk_count(int64_t rows) {
  const int64_t per = rows_per_chunk(rows);
  return (rows + per - 1) / per;
}

// Block (column tile, chunk): each thread sums its rows of the chunk for one column, then
// row lane 0 adds the kRowLanes sums in lane order and writes the chunk's partial.
template <typename T>
__global__ void __launch_bounds__(kRowBlock)
    layer_norm_params_partial_kernel(const T* x, const T* dy, const double* mean, const double* rstd, int64_t rows,
                                     int64_t dim, int64_t chunk_rows, double* partial_w, double* partial_b) {
  __shared__ double lane_w[kRowLanes][kTileColumns];
  __shared__ double lane_b[kRowLanes][kTileColumns];
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kTileColumns + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * chunk_rows;
  const int64_t end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  double sum_w = 0, sum_b = 0;
  if (column < dim) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      const T g = dy[r * dim + column];
      sum_w += g * (x[r * dim + column] - mean[r]) * rstd[r];
      sum_b += g;
    }
  }
  lane_w[threadIdx.y][threadIdx.x] = sum_w;
  lane_b[threadIdx.y][threadIdx.x] = sum_b;
  __syncthreads();
  if (threadIdx.y == 0 && column < dim) {
    double total_w = lane_w[0][threadIdx.x], total_b = lane_b[0][threadIdx.x];
    for (int k = 1; k < kRowLanes; ++k) {
      total_w += lane_w[k][threadIdx.x];
      total_b += lane_b[k][threadIdx.x];
    }
    partial_w[chunk * dim + column] = total_w;
    partial_b[chunk * dim + column] = total_b;
  }
}

// One thread per column adds the chunks' partials in chunk order.
template <typename T>
__global__ void layer_norm_params_finish_kernel(const double* partial_w, const double* partial_b, int64_t chunks,
                                                int64_t dim, T* dw, T* db) {
  for (int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; column < dim;
       column += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double total_w = 0, total_b = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      total_w += partial_w[k * dim + column];
      total_b += partial_b[k * dim + column];
    }
    if (dw != nullptr) dw[column] = static_cast<T>(total_w);
    if (db != nullptr) db[column] = static_cast<T>(total_b);
  }
}

}  // namespace

template <typename T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, double* mean, double* rstd, int64_t rows, int64_t dim,
                        double eps, CUstream_st* stream) {
  if (rows == 0 || dim == 0) return;
  launch_by_row_length(dim, [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    layer_norm_forward_kernel<T, kGroup>
        <<<row_blocks(rows, kGroup), kRowBlock, 0, stream>>>(x, w, b, y, mean, rstd, rows, dim, eps);
  });
}

template <typename T>
void layer_norm_backward_input(const T* x, const T* w, const T* dy, const double* mean, const double* rstd, T* dx,
                               int64_t rows, int64_t dim, CUstream_st* stream) {
  if (rows == 0 || dim == 0) return;
  launch_by_row_length(dim, [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    layer_norm_backward_input_kernel<T, kGroup>
        <<<row_blocks(rows, kGroup), kRowBlock, 0, stream>>>(x, w, dy, mean, rstd, dx, rows, dim);
  });
}

int64_t layer_norm_params_scratch(int64_t rows, int64_t dim) { return 2 * chunk_count(rows) * dim; }

template <typename T>
void layer_norm_backward_params(const T* x, const T* dy, const double* mean, const double* rstd, T* dw, T* db,
                                double* scratch, int64_t rows, int64_t dim, CUstream_st* stream) {
  if (dim == 0 || (dw == nullptr && db == nullptr)) return;
  const int64_t chunks = chunk_count(rows);  // 0 when rows is: the sums are then 0
  double* partial_w = scratch;
  double* partial_b = scratch + chunks * dim;
  if (chunks > 0) {
    const dim3 grid(static_cast<unsigned>((dim + kTileColumns - 1) / kTileColumns), static_cast<unsigned>(chunks));
    layer_norm_params_partial_kernel<T><<<grid, dim3(kTileColumns, kRowLanes), 0, stream>>>(
        x, dy, mean, rstd, rows, dim, rows_per_chunk(rows), partial_w, partial_b);
    LOCKSTEP_CUDA_CHECK(cudaGetLastError());
  }
  layer_norm_params_finish_kernel<T>
      <<<::lockstep::cuda::grid_for(dim, kRowBlock), kRowBlock, 0, stream>>>(partial_w, partial_b, chunks, dim, dw, db);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

#define LOCKSTEP_INSTANTIATE(T)                                                                                       \
  template void layer_norm_forward<T>(const T*, const T*, const T*, T*, double*, double*, int64_t, int64_t, double,   \
                                      CUstream_st*);                                                                  \
  template void layer_norm_backward_input<T>(const T*, const T*, const T*, const double*, const double*, T*, int64_t, \
                                             int64_t, CUstream_st*);                                                  \
  template void layer_norm_backward_params<T>(const T*, const T*, const double*, const double*, T*, T*, double*,      \
                                              int64_t, int64_t, CUstream_st*);
LOCKSTEP_INSTANTIATE(float)
LOCKSTEP_INSTANTIATE(double)
#undef LOCKSTEP_INSTANTIATE

}  // namespace lockstep::ops::cuda
