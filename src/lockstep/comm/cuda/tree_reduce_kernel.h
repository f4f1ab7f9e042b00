// tree_reduce's fold (comm/tree_reduce.h) as a CUDA kernel: the nccl backend's
// deterministic mode folds the slices the ranks exchanged with it, and single-process data
// parallelism on GPUs folds the devices' sums where they lie, so a GPU reduction has the
// same bits as the CPU backends'. Callable from plain C++ (no CUDA headers needed).
#pragma once

#include <cstdint>

#include "lockstep/comm/reduce_op.h"
#include "lockstep/core/dtype.h"

struct CUstream_st;  // = cudaStream_t, declared here so that users need no cuda_runtime.h

namespace lockstep::comm::cuda {

// out[i] = fold over k in [0, n) of rows[k * row_stride + i] for i in [0, count), in
// tree_reduce's order and with its arithmetic (bf16/f16 accumulate in f32 and round once,
// avg divides the sum by n, integer sums wrap, NaN wins max/min). rows and out are device
// pointers, elements of dtype; out may alias row k's elements (each element is read from
// every row before it is written), other overlaps are not allowed. Queued on stream;
// throws Error when the launch fails.
void tree_reduce_rows(const void* rows, int64_t row_stride, int n, void* out, int64_t count, DType dtype, ReduceOp op,
                      CUstream_st* stream);

// The most inputs tree_reduce_inputs folds in one launch (their pointers travel in the
// kernel's parameters).
inline constexpr int kMaxTreeReduceInputs = 64;

// out[i] = fold over k in [0, n) of inputs[k][i] for i in [0, count): tree_reduce_rows's
// fold and arithmetic, over n <= kMaxTreeReduceInputs device pointers that the host holds,
// each anywhere the stream's GPU can read (its own memory, or a peer's with peer access
// on). out may alias input k's elements; other overlaps are not allowed. Queued on stream;
// throws Error when n is out of range or the launch fails.
void tree_reduce_inputs(const void* const* inputs, int n, void* out, int64_t count, DType dtype, ReduceOp op,
                        CUstream_st* stream);

// data[i] /= divisor for count floating elements on the device, in f32 for bf16/f16 (or the
// dtype's own type), rounded once: avg as the sum divided afterwards, where NCCL's own
// ncclAvg multiplies by a 1/n already rounded to the dtype (0.2% off in bf16 for 3 ranks).
void divide_elements(void* data, int64_t count, DType dtype, int divisor, CUstream_st* stream);

}  // namespace lockstep::comm::cuda
