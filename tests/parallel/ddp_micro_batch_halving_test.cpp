// A distributed step (ranks as threads over `local`) that runs out of memory on one rank
// while the others go on: every rank must hear of it at the same call, none may wait for
// the rank that stopped, and none may change anything (weights, running statistics,
// optimizer state), so that the step taken again gives the bits of a run that never failed
// (the same micro-batch) or of a run that used the smaller one from the start (halved).
// The failures are injected between two buckets' collectives and in an earlier
// micro-batch, and real: CPU devices given a GPU's fixed memory, one rank carrying ballast.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/test_files.h"
#include "lockstep/io/checkpoint.h"
#include "lockstep/io/weights_sha256.h"
#include "lockstep/ops/ops.h"
#include "lockstep/train/trainer.h"
#include "parallel/halving_testing.h"
#include "parallel/rank_threads.h"
#include "parallel/step_testing.h"

namespace lockstep::parallel {
namespace {

using namespace halving_testing;
using rank_threads::run_ranks;
using step_testing::state_bits;

constexpr int kRanks = 2;
constexpr int64_t kLarge = 128, kSmall = 64;
// A rank that waits for one that stopped fails after this, not the default five minutes.
constexpr std::chrono::seconds kTimeout{20};

// The optimizer state's bytes as an unsharded optimizer holds them (collective).
std::vector<std::string> optimizer_bits(Layout& layout) {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : layout.optimizer_state()) {
    const Tensor c = tensor.contiguous();
    out.push_back(name + ":" + std::string(static_cast<const char*>(c.raw_data()), c.nbytes()));
  }
  return out;
}

struct Variant {
  std::string name;
  DistributedDataParallelOptions options;
  bool own_devices = true;  // rank r on cpu:r; else every rank on cpu:0, where their one copy is
};

std::vector<Variant> variants(int64_t micro_batch) {
  std::vector<Variant> out;
  for (int stage : {0, 1, 2}) out.push_back({"zero" + std::to_string(stage), ddp_options(stage, micro_batch)});
  Variant common{"ddp with one copy of the weights", ddp_options(0, micro_batch, /*share_weights=*/true), false};
  Variant bf16{"ddp with bf16 gradients", ddp_options(0, micro_batch)};
  bf16.options.gradient_dtype = DType::bf16;
  Variant powersgd{"PowerSGD", ddp_options(0, micro_batch)};
  powersgd.options.powersgd_rank = 2;
  powersgd.options.powersgd_start_step = 0;
  out.push_back(common);
  out.push_back(bf16);
  out.push_back(powersgd);
  return out;
}

enum class Where { nowhere, backward_between_buckets, forward_of_an_earlier_micro_batch };

struct RankOutcome {
  std::vector<std::string> state_after;  // weights and running statistics after the last step
  std::string error;                     // what step 1 threw the first time ("" if nothing)
  bool unchanged = true;                 // the failed step left weights and optimizer state as they were
};

// Steps 0, 1, 2 at micro-batch 32 (4 per rank); step 1 fails first on `failing` at `where`
// and is taken again.
std::vector<RankOutcome> run_with_failure(const Variant& variant, int failing, Where where) {
  std::vector<RankOutcome> outcomes(kRanks);
  const auto errors = run_ranks(kRanks, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    comm->set_timeout(kTimeout);
    RankOutcome& outcome = outcomes[static_cast<size_t>(rank)];
    const Replica replica = make_replica(Device::cpu(variant.own_devices ? rank : 0));
    DistributedDataParallel ddp(replica.model, adamw, comm, variant.options);
    ddp.step(batch_of(0), context_of(0));
    const std::vector<std::string> weights = state_bits(ddp.model()), optimizer = optimizer_bits(ddp);
    if (rank == failing && where == Where::backward_between_buckets) replica.runs_out->fail_backward(3);
    if (rank == failing && where == Where::forward_of_an_earlier_micro_batch) replica.runs_out->fail_forward(0);
    try {
      ddp.step(batch_of(1), context_of(1));
    } catch (const OutOfMemoryError& e) {
      outcome.error = e.what();
      outcome.unchanged = state_bits(ddp.model()) == weights && optimizer_bits(ddp) == optimizer;
      ddp.step(batch_of(1), context_of(1));
    }
    ddp.step(batch_of(2), context_of(2));
    outcome.state_after = state_bits(ddp.model());
  });
  rank_threads::expect_no_errors(errors);
  return outcomes;
}

TEST(DistributedDataParallelHalving, AFailureOnOneRankIsAgreedAndChangesNothing) {
  for (const Variant& variant : variants(32)) {
    const std::vector<RankOutcome> reference = run_with_failure(variant, 0, Where::nowhere);
    ASSERT_EQ(reference[0].error, "") << variant.name;
    for (const auto& [failing, where, phase] : {std::tuple{0, Where::backward_between_buckets, "backward"},
                                                std::tuple{1, Where::forward_of_an_earlier_micro_batch, "forward"}}) {
      const std::string what = variant.name + ", rank " + std::to_string(failing) + " in " + phase;
      const std::vector<RankOutcome> outcomes = run_with_failure(variant, failing, where);
      const std::string expected = "rank " + std::to_string(failing) +
                                   ": out of memory on cpu:" + std::to_string(variant.own_devices ? failing : 0) +
                                   " (injected in " + phase + ")";
      for (int r = 0; r < kRanks; ++r) {
        const RankOutcome& outcome = outcomes[static_cast<size_t>(r)];
        EXPECT_EQ(outcome.error, expected) << what << ": rank " << r << " heard another story";
        EXPECT_TRUE(outcome.unchanged) << what << ": the failed step changed rank " << r << "'s state";
        EXPECT_TRUE(outcome.state_after == reference[static_cast<size_t>(r)].state_after)
            << what << ": the step taken again did not give the bits of a run that never failed (rank " << r << ")";
      }
    }
  }
}

struct MeasuredRun {
  std::string weights;               // after two steps
  std::vector<int64_t> first_peaks;  // each rank's device's in the first step, in bytes
  std::vector<int64_t> peaks;        // and in both
};

// Two steps at `micro_batch`, each rank on its own device (cpu:rank), no limit.
MeasuredRun measured(const DistributedDataParallelOptions& options) {
  MeasuredRun run{.weights = "", .first_peaks = std::vector<int64_t>(kRanks), .peaks = std::vector<int64_t>(kRanks)};
  const MemoryLimit none(0, kRanks);
  const auto errors = run_ranks(kRanks, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    const auto r = static_cast<size_t>(rank);
    DistributedDataParallel ddp(make_replica(Device::cpu(rank)).model, adamw, comm, options);
    reset_peak_memory_stats(Device::cpu(rank));
    for (int64_t s = 0; s < 2; ++s) {
      ddp.step(batch_of(s), context_of(s));
      if (s == 0) run.first_peaks[r] = memory_stats(Device::cpu(rank)).peak_allocated_bytes;
    }
    run.peaks[r] = memory_stats(Device::cpu(rank)).peak_allocated_bytes;
    const std::string weights = weights_sha256(ddp.model());
    if (rank == 0) run.weights = weights;
  });
  rank_threads::expect_no_errors(errors);
  return run;
}

// A limit where every rank fits micro-batch 128 but for rank 1, whose ballast leaves it room
// for every step at 64 and not for the first at 128 (the optimizer state comes after it):
// the limit and the ballast's bytes.
std::pair<int64_t, int64_t> limit_and_ballast(const MeasuredRun& small, const MeasuredRun& large) {
  const int64_t room = (small.peaks[1] + large.first_peaks[1]) / 2;
  EXPECT_GT(large.first_peaks[1] - small.peaks[1], small.peaks[1] / 8) << "the micro-batch should decide the peak";
  const int64_t limit = *std::max_element(large.peaks.begin(), large.peaks.end()) + (room - small.peaks[1]);
  return {limit, limit - room};
}

TEST(DistributedDataParallelHalving, ARankThatRunsOutAloneHalvesEveryRank) {
  for (int stage : {0, 1, 2}) {
    const std::string what = "zero" + std::to_string(stage);
    const MeasuredRun small = measured(ddp_options(stage, kSmall)), large = measured(ddp_options(stage, kLarge));
    ASSERT_NE(small.weights, large.weights) << "the micro-batch is part of the result";
    const auto [limit, ballast] = limit_and_ballast(small, large);
    std::vector<std::string> errors_heard(kRanks), weights(kRanks);
    std::vector<char> unchanged(kRanks, 0);  // not vector<bool>: each rank's thread writes its own
    const MemoryLimit memory(limit, kRanks);
    const auto errors = run_ranks(kRanks, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
      comm->set_timeout(kTimeout);
      const auto r = static_cast<size_t>(rank);
      DistributedDataParallel ddp(make_replica(Device::cpu(rank)).model, adamw, comm, ddp_options(stage, kLarge));
      const std::string initial = weights_sha256(ddp.model());
      const Tensor held = rank == 1 ? Tensor::empty({ballast / 4}, DType::f32, Device::cpu(1)) : Tensor();
      try {
        ddp.step(batch_of(0), context_of(0));
      } catch (const OutOfMemoryError& e) {
        errors_heard[r] = e.what();
      }
      unchanged[r] = weights_sha256(ddp.model()) == initial;
      ASSERT_EQ(ddp.set_micro_batch(kSmall, kBatch), "");
      for (int64_t s = 0; s < 2; ++s) ddp.step(batch_of(s), context_of(s));
      weights[r] = weights_sha256(ddp.model());
    });
    rank_threads::expect_no_errors(errors);
    for (size_t r = 0; r < kRanks; ++r) {
      EXPECT_EQ(errors_heard[r].rfind("rank 1: out of memory on cpu:1: tried to allocate", 0), 0u)
          << what << ", rank " << r << ": " << errors_heard[r];
      EXPECT_TRUE(unchanged[r]) << what << ": the failed step changed rank " << r << "'s weights";
      EXPECT_EQ(weights[r], small.weights) << what << ", rank " << r;
    }
  }
}

std::shared_ptr<TensorDataset> dataset() {
  std::vector<Tensor> xs, ys;
  for (int64_t s = 0; s < 2; ++s) {
    const TensorBatch batch = batch_of(s);
    xs.push_back(batch.at("x"));
    ys.push_back(batch.at("y"));
  }
  return std::make_shared<TensorDataset>(TensorBatch{{"x", concat(xs, 0)}, {"y", concat(ys, 0)}});
}

// The Trainer on every rank halves at the same step, and the leader prints it once, keeps
// it in summary.json and the checkpoint.
TEST(DistributedDataParallelHalving, TheTrainerOnEveryRankHalvesAndKeepsIt) {
  const MeasuredRun small = measured(ddp_options(2, kSmall)), large = measured(ddp_options(2, kLarge));
  const auto [limit, ballast] = limit_and_ballast(small, large);
  const auto set = dataset();
  testing::TempDir dir;
  const auto fit_on_ranks = [&](int64_t micro_batch, const std::string& out, int64_t ballast_bytes) {
    std::vector<train::TrainSummary> summaries(kRanks);
    const auto errors = run_ranks(kRanks, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
      comm->set_timeout(kTimeout);
      DistributedDataParallel ddp(make_replica(Device::cpu(rank)).model, adamw, comm, ddp_options(2, micro_batch));
      const Tensor held =
          rank == 1 && ballast_bytes > 0 ? Tensor::empty({ballast_bytes / 4}, DType::f32, Device::cpu(1)) : Tensor();
      summaries[static_cast<size_t>(rank)] = train::Trainer(ddp, set,
                                                            {.batch_size = kBatch,
                                                             .steps = 2,
                                                             .seed = 3,
                                                             .lr = 1e-2,
                                                             .out_dir = dir.file(out),
                                                             .progress = false,
                                                             .halve_micro_batch_on_out_of_memory = true,
                                                             .leader = rank == 0})
                                                 .fit();
    });
    rank_threads::expect_no_errors(errors);
    return summaries;
  };
  const std::vector<train::TrainSummary> expected = fit_on_ranks(kSmall, "reference", 0);
  ::testing::internal::CaptureStderr();
  std::vector<train::TrainSummary> summaries;
  {
    const MemoryLimit memory(limit, kRanks);
    summaries = fit_on_ranks(kLarge, "halving", ballast);
  }
  const std::string printed = ::testing::internal::GetCapturedStderr();
  for (size_t r = 0; r < kRanks; ++r) {
    const train::TrainSummary& summary = summaries[r];
    EXPECT_EQ(summary.weights_sha256, expected[0].weights_sha256) << "rank " << r;
    ASSERT_EQ(summary.micro_batch_changes.size(), 1u) << "rank " << r;
    EXPECT_EQ(summary.micro_batch_changes[0].step, 1);
    EXPECT_EQ(summary.micro_batch_changes[0].from, kLarge);
    EXPECT_EQ(summary.micro_batch_changes[0].to, kSmall);
    EXPECT_EQ(summary.micro_batch_changes[0].error.rfind("rank 1: out of memory on cpu:1", 0), 0u)
        << summary.micro_batch_changes[0].error;
    EXPECT_EQ(summary.micro_batch, kSmall);
  }
  const std::string line = "step 1 ran out of memory with micro-batch 128 (rank 1: out of memory on cpu:1";
  const size_t at = printed.find(line);
  EXPECT_NE(at, std::string::npos) << printed;
  EXPECT_EQ(printed.find(line, at + 1), std::string::npos) << "only the leader prints:\n" << printed;
  const nlohmann::json json = nlohmann::json::parse(std::ifstream(dir.file("halving/summary.json")));
  EXPECT_EQ(json["micro_batch"], kSmall);
  EXPECT_EQ(json["micro_batch_changes"][0]["to"], kSmall);
  const Checkpoint checkpoint = load_checkpoint(dir.file("halving/" + std::string(train::Trainer::kCheckpointFile)));
  EXPECT_EQ(checkpoint.metadata.at("micro_batch"), "64");
}

TEST(DistributedDataParallelHalving, StagesThatCannotTakeAStepAgainSayWhy) {
  auto local_sgd = ddp_options(0, kLarge);
  local_sgd.sync_every = 4;
  const auto errors = run_ranks(kRanks, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    comm->set_timeout(kTimeout);
    DistributedDataParallel ddp(make_replica(Device::cpu(rank)).model, adamw, comm, ddp_options(0, kLarge));
    EXPECT_NE(ddp.set_micro_batch(3, kBatch), "") << "256 samples do not split into micro-batches of 3";
    EXPECT_NE(ddp.set_micro_batch(0, kBatch), "");
    EXPECT_NE(ddp.set_micro_batch(kSmall, 96), "") << "96 samples on 2 ranks in 64s";
    EXPECT_EQ(ddp.micro_batch(), kLarge);
    DistributedDataParallel sgd(make_replica(Device::cpu(rank)).model, adamw, comm, local_sgd);
    EXPECT_NE(sgd.set_micro_batch(kSmall, kBatch).find("local SGD's steps send nothing"), std::string::npos);

    // ZeRO-3 refuses, and a rank that runs out there ends the group as before.
    const Replica replica = make_replica(Device::cpu(rank));
    DistributedDataParallel zero3(replica.model, adamw, comm, ddp_options(3, kLarge));
    EXPECT_NE(zero3.set_micro_batch(kSmall, kBatch).find("ZeRO-3 gathers each unit"), std::string::npos);
    if (rank == 1) replica.runs_out->fail_backward(0);
    try {
      zero3.step(batch_of(0), context_of(0));
      ADD_FAILURE() << "rank " << rank << ": the step went on";
    } catch (const OutOfMemoryError& e) {
      EXPECT_EQ(rank, 1) << e.what();
    } catch (const comm::CommError& e) {
      EXPECT_EQ(rank, 0) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
    EXPECT_NE(zero3.set_micro_batch(kSmall, kBatch), "");
  });
  rank_threads::expect_no_errors(errors);
}

}  // namespace
}  // namespace lockstep::parallel
