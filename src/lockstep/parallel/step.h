// What every data-parallel layout shares: the layouts a step's tree can take, one leaf of
// the tree, and what a step reports (its loss and where each device's time went).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/data/tensor_batch.h"
#include "lockstep/nn/module.h"
#include "lockstep/parallel/loss_function.h"

namespace lockstep::parallel {

// Where one device's time in a step went, in seconds.
struct DeviceTimes {
  double started = 0;      // when the device began the step, on the steady clock
  double compute = 0;      // forward, backward and folding its micro-batches
  double wait = 0;         // at the all-reduce, until the slowest device arrived
  double communicate = 0;  // the all-reduce itself (with overlap: the part backward did not hide)
  double bubble = 0;       // pipeline: idle, waiting for a neighbouring stage's activations or gradients
  double optimizer = 0;    // the optimizer step
  // The step's time on the device, every part of it.
  double busy() const { return compute + wait + communicate + bubble + optimizer; }
};

using StepClock = std::chrono::steady_clock;
// Seconds from `start` until now: what DeviceTimes counts.
inline double seconds_since(StepClock::time_point start) {
  return std::chrono::duration<double>(StepClock::now() - start).count();
}

struct StepResult {
  double loss = 0;  // the mean loss over the global batch, summed in tree order
  std::vector<DeviceTimes> devices;
  bool skipped = false;  // f16: a gradient overflowed, so no update (the loss scale halved)
};

// How a step computes on GPUs: the type its matrix products read (core/autocast.h; f32 is
// plain f32) and, for f16, the loss scale its backward starts from (optim/loss_scaler.h).
struct Precision {
  DType autocast = DType::f32;
  double loss_scale = 1.0;
};

// "" when `devices` devices can share a step of `batch` samples in micro-batches of
// `micro_batch` as the step's tree needs (equal power-of-two runs of micro-batches), else
// the error, with the arithmetic and what would work.
std::string check_step_layout(int64_t batch, int64_t micro_batch, int devices);

// One leaf of the step's tree: forward and backward of rows [first, first + count) of
// `batch` (whose row 0 is global sample context.first_sample) on `device`, in a step whose
// global batch holds `global_batch` samples. loss gives one loss per sample
// (loss_function.h); each of its terms is weighted 1/(global_batch * terms per sample), so
// every micro-batch counts alike whichever device runs it. The gradients land in the
// parameters' .grad. Returns the micro-batch's share of the mean loss as a one-element f64
// tensor: the loss's own leaf.
// Under `precision` the products run in its autocast type and the gradients come out
// multiplied by its loss scale; the returned loss is never scaled.
Tensor run_micro_batch(nn::Module& model, const LossFunction& loss, const TensorBatch& batch, int64_t first,
                       int64_t count, int64_t global_batch, const StepContext& context, Device device,
                       const Precision& precision = {});

// What every layout checks: that it was given a loss function (at construction), and that a
// step's batch holds samples. The errors name the layout.
void check_loss_function(const char* layout, const LossFunction& loss);
void check_batch_has_samples(const char* layout, const TensorBatch& batch);

// Checks a precision for a data-parallel layout: f32, or bf16 and f16 on GPU devices.
void check_precision(DType autocast, Device device);

}  // namespace lockstep::parallel
