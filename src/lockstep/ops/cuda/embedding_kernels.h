// GPU kernels for the embedding lookup. Backward sums, for each table row, the gradient rows
// of the tokens that picked it in token order, as the CPU does: a stable radix sort of the
// indices groups equal rows with their tokens still in order, and one block per group adds
// them up, with no atomics. Pointers are device pointers; work is queued on stream.
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;  // = cudaStream_t

namespace lockstep::ops::cuda {

// out[i, :] = weight[indices[i], :] for i in [0, count). Indices are checked on the GPU:
// first_bad (one device int64) ends as -1 when every index is in [0, vocab), else as the
// first position whose index is not (that output row is left unwritten); the caller reads it
// back and raises.
template <typename T, typename Index>
void embedding_forward(const Index* indices, int64_t count, const T* weight, int64_t vocab, int64_t dim, T* out,
                       int64_t* first_bad, CUstream_st* stream);

// Bytes of device scratch embedding_backward needs for count indices into vocab rows.
template <typename Index>
size_t embedding_backward_scratch_bytes(int64_t count, int64_t vocab);

// grad_weight[v, :] = sum of grad[i, :] over the i with indices[i] == v, in increasing i.
// grad_weight must be zeroed by the caller (rows no token picked are not written); the
// indices must be in [0, vocab) (embedding_forward checked them). scratch holds
// embedding_backward_scratch_bytes(count, vocab) bytes.
template <typename T, typename Index>
void embedding_backward(const Index* indices, int64_t count, const T* grad, int64_t vocab, int64_t dim, T* grad_weight,
                        void* scratch, size_t scratch_bytes, CUstream_st* stream);

}  // namespace lockstep::ops::cuda
