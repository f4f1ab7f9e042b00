// Overlapped optimizer offload in the layouts, ranks as threads on cpu:0 (DataParallel's
// devices on cpu:0 and cpu:1) and the "host" on cpu:2, which holds no parameter (one there
// would be stepped in place): which layouts step in the background (those whose readers wait: DataParallel on CPU
// devices, ddp ranks with weights of their own), and in every layout the bits of the step in
// place and of the synchronous offload, through a checkpoint in the middle. The host's update
// is slowed down, so a reader a layout did not make wait would read weights not yet written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/io/checkpoint.h"
#include "lockstep/io/weights_sha256.h"
#include "lockstep/nn/activation.h"
#include "lockstep/nn/flatten.h"
#include "lockstep/nn/init.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/sequential.h"
#include "lockstep/parallel/optimizer_offload.h"
#include "parallel/ddp_testing.h"
#include "parallel/rank_threads.h"
#include "parallel/step_testing.h"

namespace lockstep::parallel {
namespace {

using namespace step_testing;
using rank_threads::run_ranks;

const Device kHost = Device::cpu(2);
constexpr int64_t kBatch = 16;
constexpr int kSteps = 4, kResumeAt = 2;

// Small enough that the 36 trainings below stay quick under ThreadSanitizer, and of two
// layers with parameters, so that the ZeRO stages shard and gather more than one unit.
std::shared_ptr<nn::Module> small_model(uint64_t seed) {
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(784, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 10)});
  nn::initialize(*model, seed);
  return model;
}

enum class Mode { in_place, synchronous, overlapped };

const char* mode_name(Mode mode) {
  return mode == Mode::in_place ? "in place" : mode == Mode::synchronous ? "synchronous offload" : "overlapped offload";
}

// The optimizers a layout made through it, and whether each steps in the background once
// the layout is built.
class Factory {
 public:
  Factory(const OptimizerFactory& make, Mode mode) {
    if (mode == Mode::in_place) {
      make_ = make;
      return;
    }
    const OptimizerFactory offloaded = offload_optimizer(
        make, kHost, mode == Mode::overlapped ? optim::OffloadUpdates::overlapped : optim::OffloadUpdates::synchronous);
    make_ = [this, offloaded](std::vector<Tensor> params) {
      std::unique_ptr<optim::Optimizer> optimizer = offloaded(std::move(params));
      const std::lock_guard lock(mutex_);
      // Every other optimizer slower: a reader that waits for one device's (DataParallel
      // reads device 0's state first) finds the next one's still running.
      const auto delay = std::chrono::milliseconds(made_so_far_++ % 2 == 0 ? 1 : 4);
      optimizer->set_before_host_update([delay](size_t) { std::this_thread::sleep_for(delay); });
      made_.push_back(optimizer.get());
      return optimizer;
    };
  }
  const OptimizerFactory& make() const { return make_; }
  // Per optimizer made since the last call, whether it overlaps. Called right after a
  // layout is made: an optimizer the layout makes later for a moment (DataParallel loads a
  // state through one) is gone by the next call.
  std::vector<bool> take_overlapping() {
    const std::lock_guard lock(mutex_);
    std::vector<bool> out;
    for (const optim::Optimizer* optimizer : made_) out.push_back(optimizer->overlaps_updates());
    made_.clear();
    return out;
  }

 private:
  OptimizerFactory make_;
  std::mutex mutex_;
  std::vector<optim::Optimizer*> made_;
  int made_so_far_ = 0;
};

std::string checkpoint_path(const std::string& layout, int rank) {
  return (std::filesystem::temp_directory_path() /
          ("overlapped_offload_" + layout + "_" + std::to_string(::getpid()) + "_" + std::to_string(rank) + ".ckpt"))
      .string();
}

// A checkpoint as the Trainer writes one: "model." weights, "optim." state.
void save(const std::string& path, Layout& layout) {
  NamedTensors saved;
  for (const auto& [name, tensor] : layout.optimizer_state()) saved.emplace_back("optim." + name, tensor);
  for (const auto& [name, tensor] : layout.model().state_dict()) saved.emplace_back("model." + name, tensor);
  save_checkpoint(path, saved);
}

void restore(const std::string& path, Layout& layout) {
  NamedTensors model_state, optimizer_state;
  for (const auto& [name, tensor] : load_checkpoint(path).tensors) {
    if (name.starts_with("model.")) model_state.emplace_back(name.substr(6), tensor);
    if (name.starts_with("optim.")) optimizer_state.emplace_back(name.substr(6), tensor);
  }
  layout.load_model_state(model_state);
  layout.load_optimizer_state(optimizer_state);
}

struct Result {
  std::vector<std::string> weights;  // per rank (one for DataParallel): weights_sha256
  std::vector<bool> overlapping;     // per optimizer made before the checkpoint, then after it
};

Result train_data_parallel(const OptimizerFactory& base, Mode mode) {
  Factory factory(base, mode);
  Result result;
  auto make = [&](uint64_t seed) {
    return std::make_unique<DataParallel>(
        DataParallelOptions{.loss = classification(), .devices = 2, .micro_batch = 4},
        [&](int) { return small_model(seed); }, factory.make());
  };
  auto made = [&](std::unique_ptr<DataParallel> dp) {
    for (bool o : factory.take_overlapping()) result.overlapping.push_back(o);
    return dp;
  };
  std::unique_ptr<DataParallel> dp = made(make(kSeed));
  const std::string path = checkpoint_path("dp", 0);
  for (int s = 0; s < kSteps; ++s) {
    if (s == kResumeAt) {
      save(path, *dp);
      dp.reset();  // as a resumed run starts: from nothing but the file
      dp = made(make(kSeed + 100));
      restore(path, *dp);
      std::filesystem::remove(path);
    }
    train_step(*dp, synthetic(kBatch, static_cast<uint64_t>(s)), s * kBatch, static_cast<uint64_t>(s));
  }
  result.weights.push_back(weights_sha256(dp->model()));
  return result;
}

Result train_ddp(const OptimizerFactory& base, Mode mode, const DistributedDataParallelOptions& given,
                 const std::string& name) {
  constexpr int kRanks = 2;
  Factory factory(base, mode);
  DistributedDataParallelOptions options = given;
  options.loss = classification();
  options.micro_batch = 4;
  Result result;
  result.weights.resize(kRanks);
  const auto errors = run_ranks(kRanks, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    // Collective: every rank has made its optimizer once it returns.
    auto made = [&](std::unique_ptr<DistributedDataParallel> ddp) {
      comm->barrier();
      if (rank == 0)
        for (bool o : factory.take_overlapping()) result.overlapping.push_back(o);
      comm->barrier();
      return ddp;
    };
    auto make = [&](uint64_t seed) {
      return made(std::make_unique<DistributedDataParallel>(small_model(seed), factory.make(), comm, options));
    };
    std::unique_ptr<DistributedDataParallel> ddp = make(kSeed);
    const std::string path = checkpoint_path(name, rank);
    for (int s = 0; s < kSteps; ++s) {
      if (s == kResumeAt) {
        save(path, *ddp);
        ddp.reset();
        ddp = make(kSeed + 100);
        restore(path, *ddp);
        std::filesystem::remove(path);
      }
      train_step(*ddp, synthetic(kBatch, static_cast<uint64_t>(s)), s * kBatch, static_cast<uint64_t>(s));
    }
    result.weights[static_cast<size_t>(rank)] = weights_sha256(ddp->model());  // collective under ZeRO-3
  });
  rank_threads::expect_no_errors(errors);
  return result;
}

struct Variant {
  std::string name;
  std::optional<DistributedDataParallelOptions> ddp;  // none: DataParallel on 2 CPU devices
  bool overlaps;
};

const std::vector<Variant> kVariants = {
    {"DataParallel, 2 CPU devices", std::nullopt, true},
    {"ddp, weights of each rank's own", DistributedDataParallelOptions{.share_weights = false}, true},
    {"ddp, one copy of the weights", DistributedDataParallelOptions{}, false},
    {"ZeRO-1", DistributedDataParallelOptions{.zero_stage = 1}, false},
    {"ZeRO-2", DistributedDataParallelOptions{.zero_stage = 2}, false},
    {"ZeRO-3", DistributedDataParallelOptions{.zero_stage = 3}, false},
};

Result train(const Variant& variant, const OptimizerFactory& base, Mode mode) {
  return variant.ddp ? train_ddp(base, mode, *variant.ddp,
                                 "zero" + std::to_string(variant.ddp->zero_stage) +
                                     (variant.ddp->share_weights ? "_shared" : "_own"))
                     : train_data_parallel(base, mode);
}

TEST(OverlappedOffloadLayouts, EveryLayoutGivesTheBitsInPlaceAndOverlapsWhereItsReadersWait) {
  for (const auto& [base, optimizer] : {std::pair{OptimizerFactory(ddp_testing::adamw), "AdamW"},
                                        std::pair{OptimizerFactory(ddp_testing::sgd), "SGD"}}) {
    for (const Variant& variant : kVariants) {
      const std::string what = variant.name + ", " + optimizer;
      const Result in_place = train(variant, base, Mode::in_place);
      for (const std::string& w : in_place.weights) EXPECT_EQ(w, in_place.weights.front()) << what;
      for (Mode mode : {Mode::synchronous, Mode::overlapped}) {
        const Result offloaded = train(variant, base, mode);
        EXPECT_EQ(offloaded.weights, in_place.weights) << what << ", " << mode_name(mode);
        // Two layouts (before the checkpoint and after), each with an optimizer per device
        // or rank.
        ASSERT_EQ(offloaded.overlapping.size(), 4u) << what << ", " << mode_name(mode);
        for (bool o : offloaded.overlapping)
          EXPECT_EQ(o, mode == Mode::overlapped && variant.overlaps) << what << ", " << mode_name(mode);
      }
    }
  }
}

}  // namespace
}  // namespace lockstep::parallel
