// How a reduction combines the ranks' values. avg is the sum divided by the number of
// ranks, computed after the sum (so it shares the sum's order and bits). rounded_sum is the
// sum rounded to the tensor's dtype at every node of the tree (bf16, f16; the same as sum
// on other dtypes), where sum accumulates bf16 and f16 in f32 and rounds once: a sum over
// blocks of ranks is then the sum of the blocks' own rounded sums, whatever the blocks, so
// partial sums can travel in bf16 and the result still does not depend on how many ranks
// made them.
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::comm {

enum class ReduceOp : uint8_t { sum, avg, max, min, rounded_sum };

const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min", "rounded_sum"
// Throws Error naming the accepted values.
ReduceOp parse_reduce_op(const std::string& name);

}  // namespace lockstep::comm
