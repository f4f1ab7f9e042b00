// Megatron's column-then-row-parallel MLP on 1, 2 and 4 ranks (threads over the local
// backend) against the same MLP unsplit: the same output on every rank, and each rank's
// weight gradients are its slice of the unsplit gradients.
#include "lockstep/parallel/tensor_parallel.h"

#include <gtest/gtest.h>

#include "lockstep/comm/local_communicator.h"
#include "lockstep/nn/init.h"
#include "lockstep/ops/ops.h"
#include "parallel/rank_threads.h"
#include "testing/gradcheck.h"

namespace lockstep::parallel {
namespace {

using namespace rank_threads;
using testing::random_f32;

struct Mlp {
  nn::Linear fc1{8, 16}, fc2{16, 4};
  Mlp() {
    nn::initialize(fc1, 1);
    nn::initialize(fc2, 2);
  }
};

void check_tensor_parallel_mlp(int ranks) {
  Mlp full;
  const Tensor input = random_f32({3, 5, 8}, 3);
  const Tensor projection = random_f32({3, 5, 4}, 4);  // so every output element matters
  const Tensor x = input.clone().set_requires_grad(true);
  const Tensor y = full.fc2.forward(gelu(full.fc1.forward(x)));
  sum(y * projection).backward();

  expect_no_errors(run_ranks(ranks, [&](int r, const std::shared_ptr<comm::Communicator>& group) {
    ColumnParallelLinear column(full.fc1, group);
    RowParallelLinear row(full.fc2, group);
    const Tensor xr = input.clone().set_requires_grad(true);
    const Tensor yr = row.forward(gelu(column.forward(xr)));
    sum(yr * projection).backward();
    const std::string rank = " on rank " + std::to_string(r) + " of " + std::to_string(ranks);
    expect_close(yr, y, "output" + rank);
    expect_close(xr.grad(), x.grad(), "input gradient" + rank);
    const int64_t hidden = 16 / ranks;
    expect_close(column.weight.grad(), slice(full.fc1.weight.grad(), 0, r * hidden, (r + 1) * hidden),
                 "column weight gradient" + rank);
    expect_close(column.bias.grad(), slice(full.fc1.bias.grad(), 0, r * hidden, (r + 1) * hidden),
                 "column bias gradient" + rank);
    expect_close(row.weight.grad(), slice(full.fc2.weight.grad(), 1, r * hidden, (r + 1) * hidden),
                 "row weight gradient" + rank);
    expect_close(row.bias.grad(), full.fc2.bias.grad(), "row bias gradient" + rank);
    EXPECT_EQ(column.weight.numel() + row.weight.numel(), (full.fc1.weight.numel() + full.fc2.weight.numel()) / ranks);
  }));
}

TEST(TensorParallel, ColumnThenRowMlpMatchesTheUnsplitOneOn1Rank) { check_tensor_parallel_mlp(1); }
TEST(TensorParallel, ColumnThenRowMlpMatchesTheUnsplitOneOn2Ranks) { check_tensor_parallel_mlp(2); }
TEST(TensorParallel, ColumnThenRowMlpMatchesTheUnsplitOneOn4Ranks) { check_tensor_parallel_mlp(4); }

TEST(TensorParallel, FeaturesTheGroupDoesNotDivideAreAnError) {
  const auto comms = comm::LocalCommunicator::create_group(3);
  const Mlp full;
  try {
    ColumnParallelLinear column(full.fc1, comms[0]);
    FAIL() << "16 features cannot go to 3 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("16 features do not cut into 3 equal tensor-parallel shards"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lockstep::parallel
