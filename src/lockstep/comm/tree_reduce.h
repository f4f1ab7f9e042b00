// The one order in which Lockstep combines values from several ranks (or micro-batches):
// a balanced binary tree over rank order,
//   fold(x[0..n)) = x0                               if n == 1
//                 = fold(x[0..p)) + fold(x[p..n))    p = the largest power of two below n,
// so four ranks give ((x0+x1)+(x2+x3)) and three give ((x0+x1)+x2). Splitting at a power of
// two means a tree over N·k leaves (k a power of two) is the tree over N blocks of k leaves,
// whatever N is: the data parallel guarantee stands on this. Every backend that controls
// its order uses tree_reduce, so the result is the same bits on every rank and backend.
#pragma once

#include <cstdint>

#include "lockstep/comm/reduce_op.h"
#include "lockstep/core/dtype.h"

namespace lockstep::comm {

// The largest power of two strictly below n (n >= 2).
int tree_split(int n);

// out[i] = fold over k of inputs[k][i], for count elements of dtype. out may alias any input.
// sum and avg of bf16/f16 accumulate in f32 and round once (rounded_sum rounds at every
// node instead: reduce_op.h); avg divides the sum by n in the accumulation type; avg of an integer dtype is an Error.
// u8 is not reducible.
void tree_reduce(const void* const* inputs, int n, void* out, int64_t count, DType dtype, ReduceOp op);

// The same fold, each result block written to every one of outputs[0..n_out) while it is
// still in L1: the one-host all-reduce writes its slice back to every rank this way.
// Outputs may alias inputs (each block is read in full before it is written).
void tree_reduce_to_many(const void* const* inputs, int n, void* const* outputs, int n_out, int64_t count, DType dtype,
                         ReduceOp op);

// Throws Error unless op can reduce dtype (names the pair and the alternatives).
void check_reducible(DType dtype, ReduceOp op);

}  // namespace lockstep::comm
