// What one rank says it is calling: every backend compares these across ranks before it
// moves a byte, so a mismatch (different op, size, dtype, root) is an error naming both
// sides instead of a hang or garbage. Plain data, so it can live in shared memory.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/comm/reduce_op.h"
#include "lockstep/core/dtype.h"

namespace lockstep::comm {

enum class CollectiveKind : uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, barrier, split };

const char* collective_name(CollectiveKind kind);

struct CollectiveDesc {
  uint64_t sequence = 0;  // collectives called so far on this communicator, this one included
  int64_t count = 0;      // elements per rank: the in-place buffer, or reduce_scatter's output
  CollectiveKind kind = CollectiveKind::barrier;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int32_t root = 0;  // broadcast's source rank
};

// "all_reduce #3 (1000 f32, sum)": how errors name a call.
std::string describe(const CollectiveDesc& desc);

// Throws Error if any rank's description differs from rank 0's, naming both ranks and
// what each passed. descs[r] is rank r's; all n must have arrived.
void check_same_on_all_ranks(const CollectiveDesc* descs, int n);

}  // namespace lockstep::comm
