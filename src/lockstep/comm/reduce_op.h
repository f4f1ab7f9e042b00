// How a reduction combines the ranks' values. avg is the sum divided by the number of
// ranks, computed after the sum (so it shares the sum's order and bits).
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::comm {

enum class ReduceOp : uint8_t { sum, avg, max, min };

const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min"
// Throws Error naming the accepted values.
ReduceOp parse_reduce_op(const std::string& name);

}  // namespace lockstep::comm
