// Optimizer offload overlapped with the next forward (OffloadUpdates::overlapped under a
// ParameterReadGuard): the parameters on cpu:0, the "host" on cpu:1, a training loop of the
// MLP. The reference is the step in place (no offload) and the synchronous offload: the same
// weights, bit for bit, through a checkpoint in the middle. A host update made slow on
// purpose shows that step() returns first and that every reader still sees updated weights.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/core/parallel.h"
#include "lockstep/io/checkpoint.h"
#include "lockstep/io/weights_sha256.h"
#include "lockstep/nn/models.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/optim/optimizer_read_guard.h"
#include "lockstep/optim/sgd.h"
#include "parallel/step_testing.h"

namespace lockstep::optim {
namespace {

using parallel::step_testing::synthetic;

const Device kHost = Device::cpu(1);
constexpr uint64_t kModelSeed = 3;
constexpr int64_t kBatch = 8;

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

const MakeOptimizer kAdamW = [](std::vector<Tensor> params) {
  return std::make_unique<AdamW>(std::move(params), AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
};
const MakeOptimizer kSgd = [](std::vector<Tensor> params) {
  return std::make_unique<SGD>(std::move(params), SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01});
};

enum class Mode { in_place, synchronous, overlapped };

const char* mode_name(Mode mode) {
  return mode == Mode::in_place ? "in place" : mode == Mode::synchronous ? "synchronous offload" : "overlapped offload";
}

// One intra-op thread for the test's thread (and so for the host's update, which takes the
// caller's team), put back after: ThreadSanitizer cannot see OpenMP's barriers.
class OneThread {
 public:
  OneThread() : previous_(num_threads()) { set_num_threads(1); }
  ~OneThread() { set_num_threads(previous_); }

 private:
  int previous_;
};

// A model and its optimizer in one of the modes, with the guard that lets the overlapped
// one step in the background.
struct Trainee {
  Trainee(const MakeOptimizer& make, Mode mode, uint64_t seed = kModelSeed)
      : model(nn::make_model("mlp", seed)), optimizer(make(model->parameters())) {
    if (mode != Mode::in_place)
      optimizer->offload_to(kHost, mode == Mode::overlapped ? OffloadUpdates::overlapped : OffloadUpdates::synchronous);
    guard = std::make_unique<ParameterReadGuard>(std::vector<nn::Module*>{model.get()},
                                                 std::vector<Optimizer*>{optimizer.get()});
  }
  // Forward and backward on step s's batch, then the step.
  void step(uint64_t s) {
    const auto data = synthetic(kBatch, s);
    cross_entropy((*model)(data.images), data.labels).backward();
    optimizer->step();
    optimizer->zero_grad();
  }

  std::shared_ptr<nn::Module> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<ParameterReadGuard> guard;  // last: goes first
};

// `steps` steps; after `resume_at` of them the model and the optimizer state go through a
// checkpoint file, and a model made from another seed, with a new optimizer, goes on from it.
// The weights' SHA-256.
std::string train(const MakeOptimizer& make, Mode mode, int steps, int resume_at) {
  const OneThread one_thread;
  auto trainee = std::make_unique<Trainee>(make, mode);
  EXPECT_EQ(trainee->optimizer->overlaps_updates(), mode == Mode::overlapped) << mode_name(mode);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("overlapped_offload_" + std::to_string(::getpid()) + ".ckpt"))
          .string();
  for (int s = 0; s < steps; ++s) {
    if (s == resume_at) {
      NamedTensors saved;
      for (const auto& [name, tensor] : trainee->model->state_dict()) saved.emplace_back("model." + name, tensor);
      for (const auto& [name, tensor] : trainee->optimizer->state_dict()) saved.emplace_back("optim." + name, tensor);
      save_checkpoint(path, saved);
      trainee = std::make_unique<Trainee>(make, mode, kModelSeed + 100);
      NamedTensors model_state, optimizer_state;
      for (const auto& [name, tensor] : load_checkpoint(path).tensors) {
        if (name.starts_with("model.")) model_state.emplace_back(name.substr(6), tensor);
        if (name.starts_with("optim.")) optimizer_state.emplace_back(name.substr(6), tensor);
      }
      std::filesystem::remove(path);
      trainee->model->load_state_dict(model_state);
      trainee->optimizer->load_state_dict(optimizer_state);
    }
    trainee->step(static_cast<uint64_t>(s));
  }
  return weights_sha256(*trainee->model);
}

TEST(OverlappedOffload, GivesTheBitsOfTheStepInPlaceAndOfTheSynchronousOffload) {
  for (const auto& [make, name] : {std::pair{kAdamW, "AdamW"}, std::pair{kSgd, "SGD"}}) {
    const std::string in_place = train(make, Mode::in_place, 5, 2);
    EXPECT_EQ(train(make, Mode::synchronous, 5, 2), in_place) << name;
    EXPECT_EQ(train(make, Mode::overlapped, 5, 2), in_place) << name;
    // The checkpoint changes nothing either (an independent check on the resume itself).
    EXPECT_EQ(train(make, Mode::in_place, 5, -1), in_place) << name;
  }
}

// Where the parameters' readers are not made to wait, the overlapped offload steps inside
// step(): no guard, or a parameter that is not the guarded model's.
TEST(OverlappedOffload, StepsInsideTheStepWhereNoGuardCoversTheReaders) {
  const OneThread one_thread;
  auto model = nn::make_model("mlp", kModelSeed);
  std::unique_ptr<Optimizer> adamw = kAdamW(model->parameters());
  adamw->offload_to(kHost);
  EXPECT_FALSE(adamw->overlaps_updates());
  std::thread::id updater;
  adamw->set_before_host_update([&](size_t) { updater = std::this_thread::get_id(); });
  const auto data = synthetic(kBatch, 0);
  cross_entropy((*model)(data.images), data.labels).backward();
  adamw->step();
  EXPECT_EQ(updater, std::this_thread::get_id());

  Tensor outside = Tensor::zeros({3});
  outside.set_requires_grad(true);
  std::vector<Tensor> params = model->parameters();
  params.push_back(outside);
  std::unique_ptr<Optimizer> with_outside = kAdamW(params);
  with_outside->offload_to(kHost);
  const ParameterReadGuard guard({model.get()}, {with_outside.get()});
  EXPECT_TRUE(guard.overlapped().empty());
  EXPECT_FALSE(with_outside->overlaps_updates());
  EXPECT_FALSE(model->has_parameter_access_hook());  // nothing overlapped: no hooks either

  std::unique_ptr<Optimizer> synchronous = kAdamW(model->parameters());
  synchronous->offload_to(kHost, OffloadUpdates::synchronous);
  const ParameterReadGuard asked_not_to({model.get()}, {synchronous.get()});
  EXPECT_FALSE(synchronous->overlaps_updates());
}

TEST(OverlappedOffload, OneGuardPerModelAndItsHooksGoWithIt) {
  const OneThread one_thread;
  auto model = nn::make_model("mlp", kModelSeed);
  std::unique_ptr<Optimizer> adamw = kAdamW(model->parameters());
  adamw->offload_to(kHost);
  {
    const ParameterReadGuard guard({model.get()}, {adamw.get()});
    EXPECT_TRUE(adamw->overlaps_updates());
    for (const auto& [name, module] : model->named_modules()) EXPECT_TRUE(module->has_parameter_access_hook()) << name;
    std::unique_ptr<Optimizer> second = kAdamW(model->parameters());
    second->offload_to(kHost);
    try {
      const ParameterReadGuard again({model.get()}, {second.get()});
      FAIL() << "a second guard over the same model was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("module 'MLP' already waits for another guard's optimizers"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_FALSE(adamw->overlaps_updates());
  for (const auto& [name, module] : model->named_modules()) EXPECT_FALSE(module->has_parameter_access_hook()) << name;
}

// A gate the host's update waits at: opened once, by the forward.
class Gate {
 public:
  void open() {
    {
      const std::lock_guard lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }
  // Whether it opened within the time (a test that would otherwise hang says so instead).
  bool wait() {
    std::unique_lock lock(mutex_);
    return opened_.wait_for(lock, std::chrono::seconds(60), [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

// The weights of `model`'s layer as bytes.
std::string bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), c.nbytes());
}

// The MLP's parameters are fc1.weight, fc1.bias, fc2.weight, ... (0 to 5). The host's update
// of fc2 and fc3 (2 to 5) waits until fc1's forward has begun, and is slow: step() has
// returned before it (it could not have otherwise), and each layer's forward still reads the
// weights the step in place gives, as does the model's state_dict after it.
TEST(OverlappedOffload, TheNextForwardRunsDuringTheUpdateAndReadsUpdatedWeights) {
  const OneThread one_thread;
  Trainee in_place(kAdamW, Mode::in_place), overlapped(kAdamW, Mode::overlapped);
  for (uint64_t s = 0; s < 2; ++s) {
    in_place.step(s);
    if (s == 1) {
      auto gate = std::make_shared<Gate>();
      auto gate_opened = std::make_shared<std::atomic<bool>>(true);
      auto updated = std::make_shared<std::atomic<int>>(0);
      overlapped.optimizer->set_before_host_update([=](size_t index) {
        if (index >= 2) {
          if (!gate->wait()) *gate_opened = false;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        ++*updated;
      });
      overlapped.step(s);
      EXPECT_LT(updated->load(), 6) << "step() returned after the host's update";
      auto* mlp = dynamic_cast<nn::MLP*>(overlapped.model.get());
      auto* reference = dynamic_cast<nn::MLP*>(in_place.model.get());
      ASSERT_NE(mlp, nullptr);
      // What each layer reads as its forward begins (after its parameters' wait).
      std::vector<std::string> stale;
      auto check = [&](const std::string& name, nn::Linear& layer, nn::Linear& expected) {
        if (bytes_of(layer.weight) != bytes_of(expected.weight) || bytes_of(layer.bias) != bytes_of(expected.bias))
          stale.push_back(name);
      };
      mlp->fc1->set_forward_hooks(
          [&] {
            check("fc1", *mlp->fc1, *reference->fc1);
            gate->open();
          },
          nullptr);
      mlp->fc2->set_forward_hooks([&] { check("fc2", *mlp->fc2, *reference->fc2); }, nullptr);
      mlp->fc3->set_forward_hooks([&] { check("fc3", *mlp->fc3, *reference->fc3); }, nullptr);
      const auto next = synthetic(kBatch, 2);
      const Tensor logits = (*overlapped.model)(next.images);
      for (const auto& layer : {mlp->fc1, mlp->fc2, mlp->fc3}) layer->set_forward_hooks(nullptr, nullptr);
      EXPECT_TRUE(gate_opened->load()) << "the host's update never saw the next forward begin: step() waited for it";
      EXPECT_EQ(stale, std::vector<std::string>{}) << "layers whose forward read weights the update had not written";
      EXPECT_EQ(bytes_of(logits), bytes_of((*in_place.model)(next.images)));
      EXPECT_EQ(weights_sha256(*overlapped.model), weights_sha256(*in_place.model));
      EXPECT_EQ(updated->load(), 6);
    } else {
      overlapped.step(s);
    }
  }
}

// A slow update, and what reads or changes it whole right after a step: the model's
// state_dict and parameters wait for all of it, set_lr for the update that reads the old
// rate, the optimizer's state_dict for the state.
TEST(OverlappedOffload, ReadingTheWholeModelWaitsForTheWholeUpdate) {
  const OneThread one_thread;
  Trainee in_place(kSgd, Mode::in_place), overlapped(kSgd, Mode::overlapped);
  overlapped.optimizer->set_before_host_update(
      [](size_t) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  in_place.step(0);
  overlapped.step(0);
  EXPECT_EQ(weights_sha256(*overlapped.model), weights_sha256(*in_place.model));
  in_place.step(1);
  overlapped.step(1);
  const std::vector<Tensor> got = overlapped.model->parameters(), expected = in_place.model->parameters();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(bytes_of(got[i]), bytes_of(expected[i])) << "parameter " << i;
  in_place.step(2);
  overlapped.step(2);
  // The next step's rate, set while the host still updates with this one's.
  for (Trainee* t : {&in_place, &overlapped}) t->optimizer->set_lr(0.02);
  in_place.step(3);
  overlapped.step(3);
  const NamedTensors state = overlapped.optimizer->state_dict(), expected_state = in_place.optimizer->state_dict();
  ASSERT_EQ(state.size(), expected_state.size());
  for (size_t i = 0; i < state.size(); ++i)
    EXPECT_EQ(bytes_of(state[i].second), bytes_of(expected_state[i].second)) << state[i].first;
  EXPECT_EQ(weights_sha256(*overlapped.model), weights_sha256(*in_place.model));
}

// The host's update of parameter 3 fails: step() has returned, and the next reader of that
// parameter (fc2's forward), or of the state, gets the error, and so does every one after it.
// fc1's parameters (0 and 1) landed before the failure and read as usual.
TEST(OverlappedOffload, AnErrorInTheBackgroundIsThrownAtTheNextWait) {
  const OneThread one_thread;
  Trainee overlapped(kAdamW, Mode::overlapped);
  overlapped.step(0);
  overlapped.optimizer->set_before_host_update(
      [](size_t index) { LOCKSTEP_CHECK(index != 3) << "the host ran out of pinned memory (injected)"; });
  overlapped.step(1);
  auto* mlp = dynamic_cast<nn::MLP*>(overlapped.model.get());
  ASSERT_NE(mlp, nullptr);
  const auto data = synthetic(kBatch, 2);
  EXPECT_NO_THROW((*mlp->fc1)(data.images.reshape({kBatch, 784})));
  const std::string expected =
      "AdamW's offloaded update of parameter 3 in step 2 failed in the background: the host ran out of pinned "
      "memory (injected)\n\tThat parameter and those after it (3 of the step's 6) missed the update, so the weights "
      "are partly updated and the run cannot go on from them: resume from the last checkpoint";
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      (*overlapped.model)(data.images);
      FAIL() << "the forward read parameters whose update failed";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), expected) << "attempt " << attempt;
    }
  }
  EXPECT_THROW(overlapped.optimizer->state_dict(), Error);
  EXPECT_THROW(overlapped.model->state_dict(), Error);
  EXPECT_THROW(overlapped.optimizer->step(), Error);
}

}  // namespace
}  // namespace lockstep::optim
