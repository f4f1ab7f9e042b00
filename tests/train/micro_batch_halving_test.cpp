// A step that runs out of device memory is taken again with half the micro-batch: CPU
// devices get a GPU's fixed memory (set_cpu_device_memory_limit) between the peaks of the
// two micro-batches, measured here. DataParallel's failed step changes nothing, and the run
// that halves gives the bits of a run with the smaller micro-batch from the start; the
// Trainer prints, keeps and checkpoints the change; without the option the error ends it.
// DistributedDataParallel's side is tests/parallel/ddp_micro_batch_halving_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/test_files.h"
#include "lockstep/comm/local_communicator.h"
#include "lockstep/core/allocator.h"
#include "lockstep/io/checkpoint.h"
#include "lockstep/io/weights_sha256.h"
#include "lockstep/nn/activation.h"
#include "lockstep/nn/init.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/sequential.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/parallel/distributed_data_parallel.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {
namespace {

constexpr int kDevices = 2;
constexpr int64_t kBatch = 256, kLarge = 128, kSmall = 64;

// Wide activations and few parameters: the micro-batch decides the peak.
std::shared_ptr<TensorDataset> data() {
  std::vector<float> x(4 * kBatch * 8), y(4 * kBatch);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
  for (size_t i = 0; i < y.size(); ++i) y[i] = x[8 * i] - 0.5f * x[8 * i + 3];
  return std::make_shared<TensorDataset>(
      TensorBatch{{"x", Tensor::from_vector(x, {4 * kBatch, 8})}, {"y", Tensor::from_vector(y, {4 * kBatch, 1})}});
}

std::unique_ptr<parallel::DataParallel> layout(int64_t micro_batch) {
  return std::make_unique<parallel::DataParallel>(
      parallel::DataParallelOptions{
          .loss = parallel::mse_loss("x", "y"), .devices = kDevices, .micro_batch = micro_batch},
      [](int) {
        auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
            std::make_shared<nn::Linear>(8, 512), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(512, 1)});
        nn::initialize(*model, 11);
        return model;
      },
      [](std::vector<Tensor> params) {
        return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = 1e-2});
      });
}

void empty_caches() {
  for (int d = 0; d < kDevices; ++d) empty_cache(Device::cpu(d));
}

// The devices' memory for the while, every cache emptied first.
class MemoryLimit {
 public:
  explicit MemoryLimit(int64_t bytes) {
    empty_caches();
    set_cpu_device_memory_limit(bytes);
  }
  ~MemoryLimit() { set_cpu_device_memory_limit(0); }
  MemoryLimit(const MemoryLimit&) = delete;
  MemoryLimit& operator=(const MemoryLimit&) = delete;
};

parallel::StepContext context_of(int64_t step) {
  return {.seed = 3, .step = static_cast<uint64_t>(step), .first_sample = step * kBatch};
}

TensorBatch batch_of(const TensorDataset& set, int64_t step) { return set.range(step * kBatch, kBatch); }

struct MeasuredRun {
  std::string weights;
  int64_t peak = 0;                 // the largest device's, in bytes
  std::vector<int64_t> peaks = {};  // each device's
};

// Two steps at `micro_batch`, no limit.
MeasuredRun measured(const TensorDataset& set, int64_t micro_batch) {
  empty_caches();
  const auto dp = layout(micro_batch);
  for (int d = 0; d < kDevices; ++d) reset_peak_memory_stats(Device::cpu(d));
  for (int64_t s = 0; s < 2; ++s) dp->step(batch_of(set, s), context_of(s));
  MeasuredRun run{.weights = weights_sha256(dp->model())};
  for (int d = 0; d < kDevices; ++d) {
    run.peaks.push_back(memory_stats(Device::cpu(d)).peak_allocated_bytes);
    run.peak = std::max(run.peak, run.peaks.back());
  }
  return run;
}

// Between the two micro-batches' peaks, checked to lie apart.
int64_t limit_between(const MeasuredRun& small, const MeasuredRun& large) {
  EXPECT_GT(large.peak, small.peak + small.peak / 4) << "the micro-batch should decide the peak";
  return (small.peak + large.peak) / 2;
}

TEST(MicroBatchHalving, AStepThatRunsOutChangesNothingAndRunsAtHalf) {
  const auto set = data();
  const MeasuredRun small = measured(*set, kSmall), large = measured(*set, kLarge);
  ASSERT_NE(small.weights, large.weights) << "the micro-batch is part of the result";
  const auto dp = layout(kLarge);
  const std::string initial = weights_sha256(dp->model());
  {
    const MemoryLimit limit(limit_between(small, large));
    EXPECT_THROW(dp->step(batch_of(*set, 0), context_of(0)), OutOfMemoryError);
    EXPECT_EQ(weights_sha256(dp->model()), initial) << "the failed step changed the weights";
    EXPECT_EQ(dp->set_micro_batch(kSmall, kBatch), "");
    EXPECT_EQ(dp->micro_batch(), kSmall);
    for (int64_t s = 0; s < 2; ++s) dp->step(batch_of(*set, s), context_of(s));
  }
  EXPECT_EQ(weights_sha256(dp->model()), small.weights);
}

// Only device 0 runs out (it carries ballast), while device 1 finishes its backward and
// waits for it at the barrier: that wait ends with the group's abort, so the layout must
// make a fresh group for the next step, and the first error (device 0's) must be the one
// that comes out, or no loop would know to retry.
TEST(MicroBatchHalving, OneDeviceRunsOutWhileTheOtherWaits) {
  const auto set = data();
  const MeasuredRun small = measured(*set, kSmall), large = measured(*set, kLarge);
  const int64_t activations = large.peaks[1] - small.peaks[1];
  ASSERT_GT(activations, 0);
  // Device 1 fits micro-batch 128 with room to spare; device 0, with the ballast, fits only 64.
  const int64_t limit = large.peaks[1] + activations / 4;
  const int64_t ballast = limit - (small.peaks[0] + large.peaks[0]) / 2;
  ASSERT_GT(ballast, 0);
  const auto dp = layout(kLarge);
  const std::string initial = weights_sha256(dp->model());
  {
    const MemoryLimit memory(limit);
    const Tensor held = Tensor::empty({ballast / 4}, DType::f32, Device::cpu(0));
    try {
      dp->step(batch_of(*set, 0), context_of(0));
      ADD_FAILURE() << "device 0 did not run out";
    } catch (const OutOfMemoryError& e) {
      EXPECT_NE(std::string(e.what()).find("cpu:0"), std::string::npos) << e.what();
    }
    EXPECT_EQ(weights_sha256(dp->model()), initial) << "the failed step changed the weights";
    EXPECT_EQ(dp->set_micro_batch(kSmall, kBatch), "");
    for (int64_t s = 0; s < 2; ++s) dp->step(batch_of(*set, s), context_of(s));
  }
  EXPECT_EQ(weights_sha256(dp->model()), small.weights);
}

TEST(MicroBatchHalving, TheTrainerHalvesPrintsAndKeepsIt) {
  const auto set = data();
  const MeasuredRun small = measured(*set, kSmall), large = measured(*set, kLarge);
  testing::TempDir dir;
  const auto options = [&](const std::string& out, bool halve) {
    return TrainerOptions{.batch_size = kBatch,
                          .steps = 2,
                          .seed = 3,
                          .lr = 1e-2,
                          .out_dir = dir.file(out),
                          .progress = false,
                          .halve_micro_batch_on_out_of_memory = halve};
  };
  const auto reference = layout(kSmall);
  const TrainSummary expected = Trainer(*reference, set, options("reference", false)).fit();

  const MemoryLimit limit(limit_between(small, large));
  const auto failing = layout(kLarge);
  EXPECT_THROW(Trainer(*failing, set, options("failing", false)).fit(), OutOfMemoryError);

  const auto halving = layout(kLarge);
  Trainer trainer(*halving, set, options("halving", true));
  ::testing::internal::CaptureStderr();
  const TrainSummary summary = trainer.fit();
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(summary.weights_sha256, expected.weights_sha256);
  ASSERT_EQ(summary.micro_batch_changes.size(), 1u);
  EXPECT_EQ(summary.micro_batch_changes[0].step, 1);
  EXPECT_EQ(summary.micro_batch_changes[0].from, kLarge);
  EXPECT_EQ(summary.micro_batch_changes[0].to, kSmall);
  EXPECT_NE(summary.micro_batch_changes[0].error.find("out of memory on cpu:"), std::string::npos);
  EXPECT_EQ(summary.micro_batch, kSmall);
  EXPECT_NE(printed.find("step 1 ran out of memory with micro-batch 128"), std::string::npos) << printed;
  EXPECT_NE(printed.find("this run's is 64 from step 1 on"), std::string::npos) << printed;

  const nlohmann::json json = nlohmann::json::parse(std::ifstream(dir.file("halving/summary.json")));
  EXPECT_EQ(json["micro_batch"], kSmall);
  EXPECT_EQ(json["micro_batch_changes"][0]["from"], kLarge);
  const Checkpoint checkpoint = load_checkpoint(dir.file("halving/" + std::string(Trainer::kCheckpointFile)));
  EXPECT_EQ(checkpoint.metadata.at("micro_batch"), "64") << "a resume continues with the micro-batch it ran";

  // Resumed at the first micro-batch, the run is refused by name.
  TrainerOptions resumed = options("halving", false);
  resumed.steps = 3;
  const auto other = layout(kLarge);
  try {
    Trainer(*other, set, resumed).fit();
    ADD_FAILURE() << "a resume with another micro-batch ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("was made with micro_batch 64, this run has 128"), std::string::npos)
        << e.what();
  }
}

TEST(MicroBatchHalving, LayoutsSayWhenTheyCannot) {
  const auto dp = layout(kLarge);
  EXPECT_NE(dp->set_micro_batch(3, kBatch), "") << "256 samples do not split into micro-batches of 3";
  EXPECT_NE(dp->set_micro_batch(0, kBatch), "");
  EXPECT_EQ(dp->micro_batch(), kLarge);
  // Across processes the ranks agree on a failed step (tests/parallel/ddp_micro_batch_halving_test.cpp),
  // but ZeRO-3, which gathers inside forward and backward, cannot.
  const auto comms = comm::LocalCommunicator::create_group(1);
  const auto ddp = [&](int zero_stage) {
    return std::make_unique<parallel::DistributedDataParallel>(
        std::make_shared<nn::Linear>(8, 1),
        [](std::vector<Tensor> params) {
          return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{});
        },
        comms[0],
        parallel::DistributedDataParallelOptions{
            .loss = parallel::mse_loss("x", "y"), .micro_batch = 4, .zero_stage = zero_stage});
  };
  const auto plain = ddp(0);
  EXPECT_EQ(plain->set_micro_batch(2, 8), "");
  EXPECT_EQ(plain->micro_batch(), 2);
  const auto zero3 = ddp(3);
  EXPECT_NE(zero3->set_micro_batch(2, 8), "") << "ZeRO-3 keeps its micro-batch";
  EXPECT_EQ(zero3->micro_batch(), 4);
}

}  // namespace
}  // namespace lockstep::train
