// The vocabulary cut over 1, 2 and 4 ranks against the unsplit embedding and cross-entropy:
// the same embeddings and losses on every rank, and each rank's slice of the gradients.
#include "lockstep/parallel/vocab_parallel.h"

#include <gtest/gtest.h>

#include "lockstep/comm/local_communicator.h"
#include "lockstep/ops/ops.h"
#include "parallel/rank_threads.h"
#include "testing/gradcheck.h"

namespace lockstep::parallel {
namespace {

using namespace rank_threads;
using testing::random_f32;

constexpr int64_t kVocab = 16, kDim = 5;
const std::vector<int64_t> kTokens = {0, 3, 15, 8, 7, 4, 12, 3};

void check_embedding(int ranks) {
  const Tensor table = random_f32({kVocab, kDim}, 1);
  const Tensor projection = random_f32({2, 4, kDim}, 2);
  const Tensor tokens = Tensor::from_vector(kTokens, {2, 4});
  const Tensor full = table.clone().set_requires_grad(true);
  const Tensor expected = embedding(tokens, full);
  sum(expected * projection).backward();
  expect_no_errors(run_ranks(ranks, [&](int r, const std::shared_ptr<comm::Communicator>& group) {
    VocabParallelEmbedding layer(table, group);
    const Tensor got = layer.forward(tokens);
    sum(got * projection).backward();
    const int64_t rows = kVocab / ranks;
    expect_close(got, expected, "embedding on rank " + std::to_string(r));
    expect_close(layer.weight.grad(), slice(full.grad(), 0, r * rows, (r + 1) * rows),
                 "table gradient on rank " + std::to_string(r));
  }));
}

void check_cross_entropy(int ranks) {
  const Tensor logits = random_f32({8, kVocab}, 3, -3, 3);
  const Tensor targets = Tensor::from_vector(kTokens, {8});
  const Tensor weights = random_f32({8}, 4);  // a gradient that differs per row
  const Tensor full = logits.clone().set_requires_grad(true);
  const Tensor expected = cross_entropy(full, targets, Reduction::none);
  sum(expected * weights).backward();
  expect_no_errors(run_ranks(ranks, [&](int r, const std::shared_ptr<comm::Communicator>& group) {
    const int64_t columns = kVocab / ranks;
    // Each rank's logits on a device of its own: the results stay there.
    const Device device = Device::cpu(r + 1);
    const Tensor mine =
        slice(logits, 1, r * columns, (r + 1) * columns).contiguous().to(device).set_requires_grad(true);
    const Tensor losses = vocab_parallel_cross_entropy(mine, targets, r * columns, group);
    sum(losses * weights.to(device)).backward();
    EXPECT_EQ(losses.device(), device);
    EXPECT_EQ(mine.grad().device(), device);
    expect_close(losses, expected, "losses on rank " + std::to_string(r));
    expect_close(mine.grad(), slice(full.grad(), 1, r * columns, (r + 1) * columns),
                 "logit gradient on rank " + std::to_string(r));
  }));
}

TEST(VocabParallel, EmbeddingMatchesTheUnsplitTableOn1Rank) { check_embedding(1); }
TEST(VocabParallel, EmbeddingMatchesTheUnsplitTableOn2Ranks) { check_embedding(2); }
TEST(VocabParallel, EmbeddingMatchesTheUnsplitTableOn4Ranks) { check_embedding(4); }
TEST(VocabParallel, CrossEntropyMatchesTheUnsplitLossOn1Rank) { check_cross_entropy(1); }
TEST(VocabParallel, CrossEntropyMatchesTheUnsplitLossOn2Ranks) { check_cross_entropy(2); }
TEST(VocabParallel, CrossEntropyMatchesTheUnsplitLossOn4Ranks) { check_cross_entropy(4); }

TEST(VocabParallel, AVocabularyTheGroupDoesNotDivideIsAnError) {
  const auto comms = comm::LocalCommunicator::create_group(3);
  try {
    VocabParallelEmbedding layer(random_f32({kVocab, kDim}, 1), comms[0]);
    FAIL() << "16 rows cannot go to 3 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a vocabulary of 16 does not cut into 3 equal shards"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lockstep::parallel
