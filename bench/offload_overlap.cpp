// What overlapping optimizer offload with the next forward buys: the step time of one
// training run three ways in one process — AdamW stepped in place (no offload), offloaded
// and stepped inside the step (synchronous), and offloaded with the host's update running
// during the next forward (overlapped) — through DataParallel on CPU devices: the
// parameters on cpu:0, the "host" on cpu:1. Each row also prints the weights' SHA-256, which
// must be the same in all three (the overlap changes no bit).
//
// On CPU devices the "host" copies are memcpy within one memory, and the forward and the
// host's update share its bandwidth and cores: the overlap can hide the update only where a
// core is idle during the forward (threads per device below the core count). On a GPU the
// forward runs on the GPU while the host's cores update; that is where it is meant to pay.
//
//   build/bin/offload_overlap [--steps N] [--width W] [--layers L] [--batch B] [--threads T]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core/philox.h"
#include "lockstep/io/weights_sha256.h"
#include "lockstep/nn/activation.h"
#include "lockstep/nn/flatten.h"
#include "lockstep/nn/init.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/sequential.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/parallel/optimizer_offload.h"

namespace lockstep {
namespace {

struct Options {
  int steps = 20;
  int64_t width = 1024;
  int layers = 6;
  int64_t batch = 16;
  int threads = 1;
};

// An MLP deep enough that the forward has layers to run while the host updates the later
// ones: 784 -> width (x layers) -> 10.
std::shared_ptr<nn::Module> make_mlp(const Options& o) {
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Flatten>());
  int64_t in = 784;
  for (int l = 0; l < o.layers; ++l) {
    model->push_back(std::make_shared<nn::Linear>(in, o.width));
    model->push_back(std::make_shared<nn::ReLU>());
    in = o.width;
  }
  model->push_back(std::make_shared<nn::Linear>(in, 10));
  nn::initialize(*model, 7);
  return model;
}

TensorBatch batch_of(int64_t batch, uint64_t step) {
  Philox rng(7, 1000 + step);
  std::vector<float> pixels(static_cast<size_t>(batch) * 784);
  for (float& p : pixels) p = uint_to_unit_float(rng.next_u32());
  std::vector<int64_t> labels(static_cast<size_t>(batch));
  for (int64_t& l : labels) l = static_cast<int64_t>(rng.next_u32() % 10);
  return {{"input", Tensor::from_vector(pixels, {batch, 1, 28, 28})}, {"target", Tensor::from_vector(labels, {batch})}};
}

struct Row {
  const char* name = "";
  double step_ms = 0;       // wall time of a step, median
  double optimizer_ms = 0;  // of it, inside optimizer.step() (median)
  std::string sha;
};

enum class Mode { in_place, synchronous, overlapped };

Row run(Mode mode, const Options& o) {
  parallel::OptimizerFactory make = [](std::vector<Tensor> params) {
    return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = 1e-3, .weight_decay = 0.01});
  };
  if (mode != Mode::in_place)
    make = parallel::offload_optimizer(
        make, Device::cpu(1),
        mode == Mode::overlapped ? optim::OffloadUpdates::overlapped : optim::OffloadUpdates::synchronous);
  parallel::DataParallel dp(
      {.loss = parallel::classification_loss("input", "target"),
       .devices = 1,
       .micro_batch = o.batch,
       .threads_per_device = o.threads},
      [&](int) { return make_mlp(o); }, make);
  const int warmup = 2;
  std::vector<double> step_ms, optimizer_ms;
  for (int s = 0; s < warmup + o.steps; ++s) {
    const auto batch = batch_of(o.batch, static_cast<uint64_t>(s));
    const auto start = std::chrono::steady_clock::now();
    const parallel::StepResult result =
        dp.step(batch, {.seed = 7, .step = static_cast<uint64_t>(s), .first_sample = s * o.batch});
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (s < warmup) continue;
    step_ms.push_back(ms);
    optimizer_ms.push_back(result.devices[0].optimizer * 1e3);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  Row row;
  row.name = mode == Mode::in_place      ? "AdamW in place (no offload)"
             : mode == Mode::synchronous ? "offloaded, synchronous"
                                         : "offloaded, overlapped";
  row.step_ms = median(step_ms);
  row.optimizer_ms = median(optimizer_ms);
  row.sha = weights_sha256(dp.model());  // waits for the last update
  return row;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  using namespace lockstep;
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--steps") {
      o.steps = std::atoi(value);
    } else if (flag == "--width") {
      o.width = std::atoll(value);
    } else if (flag == "--layers") {
      o.layers = std::atoi(value);
    } else if (flag == "--batch") {
      o.batch = std::atoll(value);
    } else if (flag == "--threads") {
      o.threads = std::atoi(value);
    } else {
      std::fprintf(stderr, "offload_overlap: unknown flag %s (--steps, --width, --layers, --batch, --threads)\n",
                   flag.c_str());
      return 2;
    }
  }
  const int64_t params = 784 * o.width + o.width + (o.layers - 1) * (o.width * o.width + o.width) + o.width * 10 + 10;
  std::printf("MLP 784-%lldx%d-10 (%.1fM parameters), batch %lld, %d thread(s) per device, AdamW, %d steps (median)\n",
              static_cast<long long>(o.width), o.layers, static_cast<double>(params) / 1e6,
              static_cast<long long>(o.batch), o.threads, o.steps);
  std::printf("parameters on cpu:0, offloaded state and update on cpu:1\n\n");
  // Interleaved twice, so drift over the run (a neighbour's load) falls on every mode alike.
  std::vector<Row> rows;
  for (int round = 0; round < 2; ++round)
    for (auto mode : {Mode::in_place, Mode::synchronous, Mode::overlapped}) {
      Row row = run(mode, o);
      if (round == 0) {
        rows.push_back(row);
      } else {
        Row& first = rows[static_cast<size_t>(mode)];
        first.step_ms = std::min(first.step_ms, row.step_ms);
        first.optimizer_ms = std::min(first.optimizer_ms, row.optimizer_ms);
      }
    }
  std::printf("%-30s %10s %22s  %s\n", "", "step ms", "inside optimizer.step", "weights_sha256");
  for (const Row& r : rows)
    std::printf("%-30s %10.2f %19.2f ms  %.16s...\n", r.name, r.step_ms, r.optimizer_ms, r.sha.c_str());
  const bool same = rows[0].sha == rows[1].sha && rows[1].sha == rows[2].sha;
  std::printf("\noverlapped vs synchronous offload: %.2fx the step time; the same bits in all three: %s\n",
              rows[2].step_ms / rows[1].step_ms, same ? "yes" : "NO");
  return same ? 0 : 1;
}
