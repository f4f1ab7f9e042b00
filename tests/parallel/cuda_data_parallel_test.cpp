// DataParallel over CUDA devices: the same bits on 1, 2 and (where LOCKSTEP_CUDA_DEVICES_PER_GPU
// or the GPUs give four) 4 GPU devices, every replica alike, in f32, bf16 and f16; each device
// holding its share of the optimizer state, gathered into the one-device state for a
// checkpoint that moves between device counts; an f16 overflow in one device's share skipping
// the step on every device; a step that runs out of memory changing nothing; and the same
// step as on the CPU up to rounding. Two logical devices may share one GPU
// (LOCKSTEP_CUDA_DEVICES_PER_GPU=2, as scripts/gpu-check runs these).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "lockstep/core/philox.h"
#include "lockstep/nn/models.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/parallel/data_parallel.h"
#include "parallel/step_testing.h"
#include "testing/devices.h"

namespace lockstep::parallel {
namespace {

using namespace step_testing;

const Device kCuda0(DeviceType::cuda, 0);
const Device kCuda1(DeviceType::cuda, 1);

// 1 and 2 GPU devices, and 4 where this machine has them (two GPUs, or one with
// LOCKSTEP_CUDA_DEVICES_PER_GPU=4): a test that needs 2 runs its 4-device case only there.
std::vector<int> gpu_device_counts() {
  std::vector<int> counts{1, 2};
  if (cuda::device_count() >= 4) counts.push_back(4);
  return counts;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& name, std::vector<Tensor> params) {
  if (name == "adamw") return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = 1e-3});
  return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
}

std::unique_ptr<DataParallel> make_data_parallel(DeviceType type, int devices, const std::string& model,
                                                 DType precision = DType::f32, const std::string& optimizer = "sgd",
                                                 int64_t micro_batch = 4) {
  DataParallelOptions options;
  options.loss = classification();
  options.devices = devices;
  options.device_type = type;
  options.micro_batch = micro_batch;
  options.precision = precision;
  return std::make_unique<DataParallel>(
      options, [model](int) { return nn::make_model(model, kSeed); },
      [optimizer](std::vector<Tensor> params) { return make_optimizer(optimizer, std::move(params)); });
}

// Steps [first_step, first_step + steps) of a batch of 32 (step s: synthetic(32, s)).
void run_steps(DataParallel& dp, int first_step, int steps, std::vector<double>* losses = nullptr) {
  for (int s = first_step; s < first_step + steps; ++s) {
    const Data data = synthetic(32, static_cast<uint64_t>(s));
    const StepResult result = train_step(dp, data, s * 32, static_cast<uint64_t>(s));
    if (losses != nullptr) losses->push_back(result.loss);
  }
}

// Replica 0's weights; every other replica must hold the same bits (each device updated its
// share and gathered the others').
Weights replica_weights(DataParallel& dp) {
  const Weights first = weights(dp.replica(0));
  for (int d = 1; d < dp.devices(); ++d)
    EXPECT_TRUE(same_bits(weights(dp.replica(d)), first)) << "replica " << d << " of " << dp.devices();
  return first;
}

Weights train(DeviceType type, int devices, const std::string& model, std::vector<double>* losses,
              DType precision = DType::f32, const std::string& optimizer = "sgd") {
  const auto dp = make_data_parallel(type, devices, model, precision, optimizer);
  run_steps(*dp, 0, 3, losses);
  EXPECT_EQ(dp->replica(0).parameters().front().device(), Device(type, 0));
  return replica_weights(*dp);
}

TEST(CudaDataParallel, SameBitsOnOneTwoAndFourGpuDevices) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda1, 2);
  for (const std::string model : {"mlp", "cnn"}) {
    for (const std::string optimizer : {"sgd", "adamw"}) {
      std::vector<double> one_losses;
      const Weights one = train(DeviceType::cuda, 1, model, &one_losses, DType::f32, optimizer);
      for (const int devices : gpu_device_counts()) {
        if (devices == 1) continue;
        std::vector<double> losses;
        EXPECT_TRUE(same_bits(train(DeviceType::cuda, devices, model, &losses, DType::f32, optimizer), one))
            << model << " " << optimizer << " on " << devices << " devices";
        EXPECT_EQ(losses, one_losses) << model << " " << optimizer << " on " << devices << " devices";
      }
    }
  }
}

TEST(CudaDataParallel, TheGpuStepIsTheCpuStepUpToRounding) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda0);
  for (const std::string model : {"mlp", "cnn"}) {
    for (const int devices : {1, 2}) {
      if (devices > cuda::device_count()) continue;  // two GPU devices where there are (gpu-check has)
      std::vector<double> gpu_losses, cpu_losses;
      const Weights gpu = train(DeviceType::cuda, devices, model, &gpu_losses);
      const Weights cpu = train(DeviceType::cpu, devices, model, &cpu_losses);
      ASSERT_EQ(gpu.size(), cpu.size());
      for (size_t t = 0; t < gpu.size(); ++t) {
        ASSERT_EQ(gpu[t].size(), cpu[t].size());
        for (size_t i = 0; i < gpu[t].size(); ++i)
          ASSERT_NEAR(gpu[t][i], cpu[t][i], 1e-4 + 1e-3 * std::fabs(cpu[t][i]))
              << model << " on " << devices << " devices, tensor " << t << " [" << i << "]";
      }
      for (size_t s = 0; s < gpu_losses.size(); ++s)
        EXPECT_NEAR(gpu_losses[s], cpu_losses[s], 1e-4) << model << " on " << devices << " devices, step " << s;
    }
  }
}

TEST(CudaDataParallel, MixedPrecisionKeepsTheBitsAcrossDevicesAndTheLossNearF32) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda1, 2);
  for (const std::string model : {"mlp", "cnn"}) {
    std::vector<double> f32_losses;
    train(DeviceType::cuda, 1, model, &f32_losses);
    for (const DType precision : {DType::bf16, DType::f16}) {
      std::vector<double> one_losses;
      const Weights one = train(DeviceType::cuda, 1, model, &one_losses, precision);
      for (const int devices : gpu_device_counts()) {
        if (devices == 1) continue;
        std::vector<double> losses;
        EXPECT_TRUE(same_bits(train(DeviceType::cuda, devices, model, &losses, precision), one))
            << model << " " << dtype_name(precision) << " on " << devices << " devices";
        EXPECT_EQ(losses, one_losses) << model << " " << dtype_name(precision) << " on " << devices << " devices";
      }
      for (size_t s = 0; s < one_losses.size(); ++s)
        EXPECT_NEAR(one_losses[s], f32_losses[s], 2e-2) << model << " " << dtype_name(precision) << " step " << s;
    }
  }
}

// The optimizer states as bytes on the host, key by key: equal bits, equal states.
void expect_same_state(const NamedTensors& got, const NamedTensors& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << what;
    EXPECT_EQ(got[i].second.shape(), want[i].second.shape()) << what << " " << want[i].first;
    EXPECT_EQ(got[i].second.dtype(), want[i].second.dtype()) << what << " " << want[i].first;
    const Tensor a = got[i].second.to(Device::cpu()).contiguous();
    const Tensor b = want[i].second.to(Device::cpu()).contiguous();
    ASSERT_EQ(a.nbytes(), b.nbytes()) << what << " " << want[i].first;
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << what << " " << want[i].first;
  }
}

// AdamW on the MLP (two moments per element, a step count per parameter), f32 and f16 (whose
// state carries the loss scaler's entries).
TEST(CudaDataParallel, EachGpuDeviceHoldsItsShareOfTheStateAndCheckpointsMoveBetweenDeviceCounts) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda1, 2);
  for (const DType precision : {DType::f32, DType::f16}) {
    const std::string what = dtype_name(precision);
    const auto one = make_data_parallel(DeviceType::cuda, 1, "mlp", precision, "adamw");
    run_steps(*one, 0, 2);
    const int64_t whole = one->optimizer_state_bytes(0);
    EXPECT_NEAR(whole, 2 * 4 * nn::make_model("mlp", kSeed)->num_parameters(), 64) << what;
    const NamedTensors one_state = one->optimizer_state();
    for (const int devices : gpu_device_counts()) {
      if (devices == 1) continue;
      const std::string where = what + " on " + std::to_string(devices) + " devices";
      const auto sharded = make_data_parallel(DeviceType::cuda, devices, "mlp", precision, "adamw");
      run_steps(*sharded, 0, 2);
      int64_t sum = 0;
      for (int d = 0; d < devices; ++d) {
        EXPECT_NEAR(sharded->optimizer_state_bytes(d), static_cast<double>(whole) / devices, 128.0)
            << where << ", device " << d;
        sum += sharded->optimizer_state_bytes(d);
      }
      EXPECT_NEAR(sum, whole, (devices - 1) * 6 * 8) << where << ": each device counts its own steps";
      // Put together from the shares, the state is the one-device optimizer's, bit for bit.
      const NamedTensors state = sharded->optimizer_state();
      expect_same_state(state, one_state, where);

      // Loaded into as many devices, it comes back as it went in.
      const auto reloaded = make_data_parallel(DeviceType::cuda, devices, "mlp", precision, "adamw");
      reloaded->load_model_state(sharded->model().state_dict());
      reloaded->load_optimizer_state(state);
      expect_same_state(reloaded->optimizer_state(), state, where + ", reloaded");

      // A checkpoint of the sharded run, loaded into one device, continues as the sharded
      // run does.
      const auto resumed = make_data_parallel(DeviceType::cuda, 1, "mlp", precision, "adamw");
      resumed->load_model_state(sharded->model().state_dict());
      resumed->load_optimizer_state(state);
      std::vector<double> sharded_losses, resumed_losses, reloaded_losses;
      run_steps(*sharded, 2, 2, &sharded_losses);
      run_steps(*resumed, 2, 2, &resumed_losses);
      run_steps(*reloaded, 2, 2, &reloaded_losses);
      const Weights continued = replica_weights(*sharded);
      EXPECT_TRUE(same_bits(replica_weights(*resumed), continued)) << where << ", resumed on one device";
      EXPECT_TRUE(same_bits(replica_weights(*reloaded), continued)) << where << ", reloaded";
      EXPECT_EQ(resumed_losses, sharded_losses) << where;
      EXPECT_EQ(reloaded_losses, sharded_losses) << where;
    }
  }
}

// x · w per sample over 1024 features: a sample's gradient of w is its own features, so one
// infinite feature makes one element of the gradient infinite and leaves the rest finite.
class WeightedSum : public nn::Module {
 public:
  static constexpr int64_t kFeatures = 1024;
  WeightedSum() : nn::Module("WeightedSum") {
    std::vector<float> initial(static_cast<size_t>(kFeatures));
    for (size_t i = 0; i < initial.size(); ++i) initial[i] = 0.01f * static_cast<float>(1 + i % 7);
    weight = register_parameter("weight", Tensor::from_vector(initial, {kFeatures}));
  }
  Tensor forward(const Tensor& x) override { return sum(mul(x, weight), {1}); }
  Tensor weight;
};

// 16 samples of features in [-0.5, 0.5) from Philox(kSeed, 2000 + step); with `overflow`,
// sample 3's feature 700 is +inf. Feature 700 falls in device 1's share on 2 devices and in
// device 2's on 4: device 0's shares stay finite.
TensorBatch weighted_sum_batch(uint64_t step, bool overflow) {
  Philox rng(kSeed, 2000 + step);
  std::vector<float> x(static_cast<size_t>(16 * WeightedSum::kFeatures));
  for (float& v : x) v = uint_to_unit_float(rng.next_u32()) - 0.5f;
  if (overflow) x[static_cast<size_t>(3 * WeightedSum::kFeatures + 700)] = std::numeric_limits<float>::infinity();
  return {{"input", Tensor::from_vector(x, {16, WeightedSum::kFeatures})}};
}

double loss_scale_of(const NamedTensors& state) {
  for (const auto& [key, tensor] : state)
    if (key == "loss_scale") return tensor.item();
  ADD_FAILURE() << "the optimizer state has no loss_scale";
  return 0;
}

// Under f16 each device checks only its own shares for an overflow; the devices agree, so a
// step whose overflow lies in one device's share is skipped on every device (a device that
// stepped alone would leave its replica and its scale apart from the others').
TEST(CudaDataParallel, AnF16OverflowInOneDevicesShareSkipsTheStepOnEveryDevice) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda1, 2);
  Weights one_device;
  std::vector<double> one_device_losses;
  for (const int devices : gpu_device_counts()) {
    const std::string where = std::to_string(devices) + " devices";
    DataParallelOptions options;
    options.loss = [](nn::Module& model, const TensorBatch& batch, const StepContext&) {
      return model(batch.at("input"));
    };
    options.devices = devices;
    options.device_type = DeviceType::cuda;
    options.micro_batch = 4;
    options.precision = DType::f16;
    DataParallel dp(
        options, [](int) { return std::make_shared<WeightedSum>(); },
        [](std::vector<Tensor> params) { return make_optimizer("sgd", std::move(params)); });
    std::vector<double> losses;
    Weights before_overflow;
    for (uint64_t s = 0; s < 3; ++s) {
      const bool overflow = s == 1;
      if (overflow) before_overflow = replica_weights(dp);
      const StepResult result = dp.step(weighted_sum_batch(s, overflow),
                                        {.seed = kSeed, .step = s, .first_sample = static_cast<int64_t>(16 * s)});
      EXPECT_EQ(result.skipped, overflow) << where << ", step " << s;
      losses.push_back(result.loss);
      if (overflow) {
        EXPECT_TRUE(same_bits(replica_weights(dp), before_overflow)) << where << ": the skipped step changed weights";
        EXPECT_EQ(loss_scale_of(dp.optimizer_state()), 32768.0) << where << ": the scale halves once";
      }
    }
    const Weights after = replica_weights(dp);
    if (devices == 1) {
      one_device = after;
      one_device_losses = losses;
      continue;
    }
    EXPECT_TRUE(same_bits(after, one_device)) << where;
    EXPECT_EQ(losses, one_device_losses) << where;
  }
}

// Restores the GPU devices' memory limit (core/cuda_device.h) when it goes.
struct DeviceMemoryLimit {
  explicit DeviceMemoryLimit(int64_t bytes) : previous(cuda::device_memory_limit()) {
    cuda::set_device_memory_limit(bytes);
  }
  ~DeviceMemoryLimit() { cuda::set_device_memory_limit(previous); }
  int64_t previous;
};

// A step that runs out of memory before the update (here at once: a 1-byte limit, and a
// micro-batch whose buffers the cache does not hold yet) changes nothing, on any device; the
// step taken again with a smaller micro-batch continues as a run that never failed.
TEST(CudaDataParallel, AStepThatRunsOutOfMemoryChangesNothing) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(kCuda1, 2);
  const auto failing = make_data_parallel(DeviceType::cuda, 2, "mlp", DType::f32, "adamw");
  const auto plain = make_data_parallel(DeviceType::cuda, 2, "mlp", DType::f32, "adamw");
  run_steps(*failing, 0, 1);
  run_steps(*plain, 0, 2);
  const Weights weights_before = replica_weights(*failing);
  const NamedTensors state_before = failing->optimizer_state();
  ASSERT_EQ(failing->set_micro_batch(8, 32), "");
  {
    const DeviceMemoryLimit limit(1);
    EXPECT_THROW(run_steps(*failing, 1, 1), OutOfMemoryError);
  }
  EXPECT_TRUE(same_bits(replica_weights(*failing), weights_before));
  expect_same_state(failing->optimizer_state(), state_before, "after the failed step");
  ASSERT_EQ(failing->set_micro_batch(4, 32), "");
  run_steps(*failing, 1, 1);
  EXPECT_TRUE(same_bits(replica_weights(*failing), replica_weights(*plain)));
}

// The message of the Error that constructing a DataParallel with `options` throws ("" if none).
std::string construction_error(const DataParallelOptions& options) {
  try {
    DataParallel dp(
        options, [](int) { return nn::make_model("mlp", kSeed); },
        [](std::vector<Tensor> params) {
          return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = 0.1});
        });
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaDataParallel, MixedPrecisionOnCpuDevicesIsAClearError) {
  DataParallelOptions options;
  options.loss = classification();
  options.precision = DType::bf16;
  const std::string error = construction_error(options);
  EXPECT_NE(error.find("runs on GPU devices"), std::string::npos) << "'" << error << "'";
}

}  // namespace
}  // namespace lockstep::parallel
