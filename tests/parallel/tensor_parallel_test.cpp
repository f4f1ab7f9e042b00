// Megatron's column-then-row-parallel MLP on 1, 2 and 4 ranks (threads over the local
// backend) against the same MLP unsplit: the same output on every rank, and each rank's
// weight gradients are its slice of the unsplit gradients.
#include "lockstep/parallel/tensor_parallel.h"

#include <gtest/gtest.h>

#include <thread>

#include "lockstep/comm/local_communicator.h"
#include "lockstep/core/parallel.h"
#include "lockstep/nn/init.h"
#include "lockstep/ops/ops.h"
#include "testing/gradcheck.h"

namespace lockstep::parallel {
namespace {

using testing::random_f32;

// Close in float32: the ranks sum the second product's partial results in another order.
void expect_close(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const auto a = actual.contiguous().to_vector<float>(), e = expected.contiguous().to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], e[i], 1e-5 * (1 + std::abs(e[i]))) << what << " [" << i << "]";
}

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

  const auto comms = comm::LocalCommunicator::create_group(ranks);
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      set_num_threads(1);
      try {
        ColumnParallelLinear column(full.fc1, comms[static_cast<size_t>(r)]);
        RowParallelLinear row(full.fc2, comms[static_cast<size_t>(r)]);
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
        EXPECT_EQ(column.weight.numel() + row.weight.numel(),
                  (full.fc1.weight.numel() + full.fc2.weight.numel()) / ranks);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
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
