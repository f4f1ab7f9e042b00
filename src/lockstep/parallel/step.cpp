#include "lockstep/parallel/step.h"

#include <bit>
#include <sstream>

#include "lockstep/comm/flight_recorder.h"
#include "lockstep/core/autocast.h"
#include "lockstep/ops/ops.h"

namespace lockstep::parallel {

std::string check_step_layout(int64_t batch, int64_t micro_batch, int devices) {
  std::ostringstream error;
  if (micro_batch < 1 || batch % micro_batch != 0) {
    error << "the global batch (" << batch << ") must be a multiple of the micro-batch (" << micro_batch << ")";
    return error.str();
  }
  const int64_t leaves = batch / micro_batch;
  const int64_t per_device = leaves / devices;
  if (leaves % devices != 0 || (devices > 1 && !std::has_single_bit(static_cast<uint64_t>(per_device)))) {
    error << "a global batch of " << batch << " in micro-batches of " << micro_batch << " is " << leaves
          << " micro-batches, which " << devices
          << " devices cannot share as equal power-of-two runs (global = micro-batch x accumulation steps x devices, "
             "accumulation steps 1, 2, 4, ...; the step's tree must split at device boundaries): use a device count "
             "that leaves each device 1, 2, 4, ... micro-batches, or change --batch-size or --micro-batch";
  }
  return error.str();
}

void check_precision(DType autocast, Device device) {
  LOCKSTEP_CHECK(autocast == DType::f32 || autocast == DType::bf16 || autocast == DType::f16)
      << "precision " << dtype_name(autocast) << " is not one of f32, bf16, f16";
  LOCKSTEP_CHECK(autocast == DType::f32 || device.is_cuda())
      << "mixed precision (" << dtype_name(autocast) << ") runs on GPU devices; " << device
      << " computes in f32: leave the precision at f32";
}

Tensor run_micro_batch(nn::Module& model, const LossFunction& loss, const TensorBatch& batch, int64_t first,
                       int64_t count, int64_t global_batch, const StepContext& context, Device device,
                       const Precision& precision) {
  const AutocastGuard autocast(precision.autocast);  // backward runs on this thread too
  const TensorBatch micro_batch = batch.slice(first, count).to(device);
  const StepContext micro_context{
      .seed = context.seed, .step = context.step, .first_sample = context.first_sample + first};
  model.set_forward_context(micro_context);
  comm::FlightRecorder& flight = comm::FlightRecorder::process();
  flight.set_micro_batch(first / count);
  const comm::FlightPhase phase("forward");  // backward follows; the step's phase comes back after
  const Tensor losses = loss(model, micro_batch, micro_context);
  // A sequence model's [count, T] losses are count * T terms, each weighted 1/(batch * T),
  // so the loss is the mean over every position of the global batch.
  const double weight = static_cast<double>(global_batch * check_per_sample_loss(losses, count));
  const Tensor total = sum(losses);
  flight.set_phase("backward");
  // The scale is a power of two: scale / weight rounds as 1 / weight does, times the scale.
  total.backward(Tensor::scalar(precision.loss_scale / weight, total.dtype(), device));
  // The loss divided where it lies (f32 to f64 is exact; one IEEE division, as on the host),
  // so a GPU step does not wait for it.
  return div(reshape(total.detach(), {1}).to(DType::f64), Tensor::full({1}, weight, DType::f64, device));
}

void check_loss_function(const char* layout, const LossFunction& loss) {
  LOCKSTEP_CHECK(loss) << layout
                       << " has no loss function: set its options' loss (e.g. parallel::classification_loss(\"input\", "
                          "\"target\"), or a function of your own; see parallel/loss_function.h)";
}

void check_batch_has_samples(const char* layout, const TensorBatch& batch) {
  LOCKSTEP_CHECK(batch.size() > 0) << layout << ": the batch holds no samples (fields: " << batch.fields().size()
                                   << "); a step needs at least one micro-batch";
}

}  // namespace lockstep::parallel
