#include <cuda_runtime.h>

#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "lockstep/core/cuda/check.h"
#include "lockstep/core/error.h"
#include "lockstep/ops/cuda/embedding_kernels.h"

namespace lockstep::ops::cuda {
namespace {

constexpr int kBlock = 256;
constexpr size_t kAlign = 256;

// Threads for one block per embedding row: whole warps covering dim, at most kBlock.
int row_threads(int64_t dim) {
  const int64_t warps = (dim + 31) / 32;
  return warps >= kBlock / 32 ? kBlock : static_cast<int>(warps < 1 ? 32 : warps * 32);
}

// One block per token (strided over the grid), its threads over the columns. An index out of
// range only records its position: the minimum of the positions does not depend on order.
template <typename T, typename Index>
__global__ void gather_kernel(const Index* indices, int64_t count, const T* weight, int64_t vocab, int64_t dim, T* out,
                              unsigned long long* first_bad) {
  for (int64_t i = blockIdx.x; i < count; i += gridDim.x) {
    const int64_t row = static_cast<int64_t>(indices[i]);
    if (row < 0 || row >= vocab) {
      if (threadIdx.x == 0) atomicMin(first_bad, static_cast<unsigned long long>(i));
      continue;
    }
    const T* src = weight + row * dim;
    T* dst = out + i * dim;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dst[d] = src[d];
  }
}

__global__ void iota_kernel(int64_t* out, int64_t count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = i;
}

// After the stable sort, tokens that picked the same row are adjacent and still in token
// order. The block at a group's first entry adds the group's gradient rows in that order
// (starting from 0, like the CPU's zeroed accumulator); other blocks have nothing to do.
template <typename T, typename Index>
__global__ void sum_groups_kernel(const Index* sorted_rows, const int64_t* sorted_tokens, int64_t count, const T* grad,
                                  int64_t dim, T* grad_weight) {
  for (int64_t i = blockIdx.x; i < count; i += gridDim.x) {
    const Index row = sorted_rows[i];
    if (i > 0 && sorted_rows[i - 1] == row) continue;
    T* dst = grad_weight + static_cast<int64_t>(row) * dim;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      T total = 0;
      for (int64_t k = i; k < count && sorted_rows[k] == row; ++k) total += grad[sorted_tokens[k] * dim + d];
      dst[d] = total;
    }
  }
}

// The low bits that hold every index in [0, vocab): the radix sort looks at no others.
template <typename Index>
int key_bits(int64_t vocab) {
  int bits = 1;
  while (bits < static_cast<int>(sizeof(Index) * 8) && (int64_t{1} << bits) < vocab) ++bits;
  return bits;
}

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Where the pieces of the scratch buffer start: sorted rows, token numbers before and after
// the sort, and the sort's own temporary storage.
struct ScratchLayout {
  size_t sorted_rows = 0, tokens_in = 0, tokens_out = 0, sort = 0, sort_bytes = 0, total = 0;
};

template <typename Index>
ScratchLayout scratch_layout(int64_t count, int64_t vocab) {
  ScratchLayout layout;
  size_t sort_bytes = 0;
  LOCKSTEP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const Index*>(nullptr), static_cast<Index*>(nullptr),
      static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), count, 0, key_bits<Index>(vocab)));
  const size_t n = static_cast<size_t>(count);
  layout.tokens_in = aligned(n * sizeof(Index));
  layout.tokens_out = layout.tokens_in + aligned(n * sizeof(int64_t));
  layout.sort = layout.tokens_out + aligned(n * sizeof(int64_t));
  layout.sort_bytes = sort_bytes;
  layout.total = layout.sort + sort_bytes;
  return layout;
}

}  // namespace

template <typename T, typename Index>
void embedding_forward(const Index* indices, int64_t count, const T* weight, int64_t vocab, int64_t dim, T* out,
                       int64_t* first_bad, CUstream_st* stream) {
  // All bits set: -1 as an int64, and above every position for the unsigned atomicMin.
  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(first_bad, 0xff, sizeof(int64_t), stream));
  if (count == 0) return;
  const int threads = row_threads(dim);
  gather_kernel<T, Index><<<::lockstep::cuda::grid_for(count * threads, threads), threads, 0, stream>>>(
      indices, count, weight, vocab, dim, out, reinterpret_cast<unsigned long long*>(first_bad));
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template <typename Index>
size_t embedding_backward_scratch_bytes(int64_t count, int64_t vocab) {
  if (count == 0) return 0;
  return scratch_layout<Index>(count, vocab).total;
}

template <typename T, typename Index>
void embedding_backward(const Index* indices, int64_t count, const T* grad, int64_t vocab, int64_t dim, T* grad_weight,
                        void* scratch, size_t scratch_bytes, CUstream_st* stream) {
  if (count == 0 || dim == 0) return;
  const ScratchLayout layout = scratch_layout<Index>(count, vocab);
  LOCKSTEP_CHECK(scratch_bytes >= layout.total)
      << "embedding backward: the scratch buffer has " << scratch_bytes << " bytes, " << layout.total
      << " are needed (size it with embedding_backward_scratch_bytes)";
  char* base = static_cast<char*>(scratch);
  auto* sorted_rows = reinterpret_cast<Index*>(base + layout.sorted_rows);
  auto* tokens_in = reinterpret_cast<int64_t*>(base + layout.tokens_in);
  auto* tokens_out = reinterpret_cast<int64_t*>(base + layout.tokens_out);

  iota_kernel<<<::lockstep::cuda::grid_for(count, kBlock), kBlock, 0, stream>>>(tokens_in, count);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
  // Radix sorting is stable: equal rows keep their tokens in increasing order.
  size_t sort_bytes = layout.sort_bytes;
  LOCKSTEP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + layout.sort, sort_bytes, indices, sorted_rows, tokens_in,
                                                      tokens_out, count, 0, key_bits<Index>(vocab), stream));
  const int threads = row_threads(dim);
  sum_groups_kernel<T, Index><<<::lockstep::cuda::grid_for(count * threads, threads), threads, 0, stream>>>(
      sorted_rows, tokens_out, count, grad, dim, grad_weight);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

template size_t embedding_backward_scratch_bytes<int32_t>(int64_t, int64_t);
template size_t embedding_backward_scratch_bytes<int64_t>(int64_t, int64_t);

#define LOCKSTEP_INSTANTIATE(T, Index)                                                                             \
  template void embedding_forward<T, Index>(const Index*, int64_t, const T*, int64_t, int64_t, T*, int64_t*,       \
                                            CUstream_st*);                                                         \
  template void embedding_backward<T, Index>(const Index*, int64_t, const T*, int64_t, int64_t, T*, void*, size_t, \
                                             CUstream_st*);
LOCKSTEP_INSTANTIATE(float, int32_t)
LOCKSTEP_INSTANTIATE(float, int64_t)
LOCKSTEP_INSTANTIATE(double, int32_t)
LOCKSTEP_INSTANTIATE(double, int64_t)
#undef LOCKSTEP_INSTANTIATE

}  // namespace lockstep::ops::cuda
