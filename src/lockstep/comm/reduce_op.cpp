#include "lockstep/comm/reduce_op.h"

#include "lockstep/core/error.h"

namespace lockstep::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
    case ReduceOp::rounded_sum:
      return "rounded_sum";
  }
  return "?";
}

ReduceOp parse_reduce_op(const std::string& name) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::rounded_sum}) {
    if (name == reduce_op_name(op)) return op;
  }
  LOCKSTEP_FAIL() << "unknown reduction '" << name << "': use sum, avg, max, min or rounded_sum";
  return ReduceOp::sum;
}

}  // namespace lockstep::comm
