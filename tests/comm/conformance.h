// The conformance suite every backend runs: the same checks on threads (local), on
// processes (shm, mpi). Each function is collective: every rank of comm calls it. Inputs
// are crafted so the exact result is known, and reductions are compared bit for bit with
// a reference that folds in the documented tree order on its own.
#pragma once

#include "lockstep/comm/communicator.h"

namespace lockstep::comm::testing {

// all_reduce sum/avg/max/min on every dtype, counts 0, 1, 7, 1000 and 2^20+1 (2^16+1
// under ThreadSanitizer).
void check_all_reduce_exact(Communicator& comm);
// f32, f64, bf16 and f16 sums of irregular values equal the tree-order fold bit for bit,
// and so do rounded_sum's (each node rounded to the dtype).
void check_all_reduce_tree_order(Communicator& comm);
void check_rounded_sum_tree_order(Communicator& comm);
void check_reduce_scatter(Communicator& comm);
void check_all_gather(Communicator& comm);
void check_broadcast(Communicator& comm);
void check_send_recv(Communicator& comm);
void check_barrier_and_async(Communicator& comm);
void check_split(Communicator& comm);
void check_common_memory(Communicator& comm);
// All of the above.
void run_conformance(Communicator& comm);

// Ranks disagree on the element count: every rank's error names rank 0 and the odd rank.
// Leaves comm unusable.
void check_mismatch_is_named(Communicator& comm);

// The value rank r contributes at element i in the tree-order checks (irregular, so any
// other summation order gives different bits).
float irregular_value(int rank, int64_t i);
// The tree-order fold of v[0..n), written independently of the library.
double reference_tree_sum(const double* v, int n);
float reference_tree_sum(const float* v, int n);

}  // namespace lockstep::comm::testing
