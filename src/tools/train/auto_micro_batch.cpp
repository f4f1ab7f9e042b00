#include "tools/train/auto_micro_batch.h"

#include "lockstep/core/error.h"
#include "lockstep/gpu/nvml.h"
#include "tools/plan/machine_profile.h"
#include "tools/plan/model_facts.h"

namespace lockstep::tools {
namespace {

// The plan's description of the layout the train plan settled on, any micro-batch.
LayoutChoice layout_of(const TrainPlan& plan) {
  const TrainOptions& s = plan.settings;
  LayoutChoice layout{.checkpoint_activations = s.checkpoint_activations, .precision = s.precision};
  if (s.strategy == "mesh") {
    layout.dp = plan.mesh.mesh.dp;
    layout.tp = plan.mesh.mesh.tp;
    layout.pp = plan.mesh.mesh.pp;
    layout.zero = plan.mesh.zero_stage;
    layout.schedule = plan.mesh.schedule;
  } else {
    layout.dp = plan.replicas;
    layout.zero = s.strategy.starts_with("zero") ? s.strategy.back() - '0' : 0;
  }
  return layout;
}

}  // namespace

MicroBatchChoice choose_micro_batch(const TrainPlan& plan, const ModelFacts& model, const MachineProfile& machine) {
  const LayoutChoice wanted = layout_of(plan);
  const PlanRequest request{.batch = plan.settings.batch_size,
                            .devices = wanted.dp * wanted.tp * wanted.pp,
                            .optimizer = plan.settings.optimizer,
                            .precision = plan.settings.precision};
  MicroBatchChoice best{.device_bytes = machine.memory_bytes};
  double smallest_needed = -1;
  for (LayoutChoice layout : candidate_layouts(model, request)) {
    if (layout.dp != wanted.dp || layout.tp != wanted.tp || layout.pp != wanted.pp || layout.zero != wanted.zero ||
        layout.checkpoint_activations != wanted.checkpoint_activations ||
        (wanted.pp > 1 && layout.schedule != wanted.schedule))
      continue;
    const LayoutPrediction prediction = predict_layout(model, machine, request, layout);
    if (smallest_needed < 0 || prediction.memory.total() < smallest_needed) smallest_needed = prediction.memory.total();
    if (prediction.fits && layout.micro_batch > best.micro_batch) {
      best.micro_batch = layout.micro_batch;
      best.predicted_bytes = prediction.memory.total();
    }
  }
  if (best.micro_batch == 0) {
    throw UsageError("--micro-batch auto: no micro-batch of this layout fits: the smallest needs " +
                     memory_text(smallest_needed) + " per device, which has " + memory_text(machine.memory_bytes) +
                     "; `lockstep plan` lists the layouts that fit");
  }
  return best;
}

MicroBatchChoice choose_micro_batch_here(const TrainPlan& plan, const TrainEnvironment& environment) {
  const TrainOptions& s = plan.settings;
  if (environment.launch.world_size > environment.launch.local_world_size) {
    throw UsageError(
        "--micro-batch auto across hosts: each host would choose for its own memory; give a number "
        "(`lockstep plan` predicts which fit)");
  }
  const int devices = s.strategy == "mesh" ? plan.mesh.mesh.size() : plan.replicas;
  const ModelFacts model = s.model == "gpt" ? gpt_model_facts(plan.gpt, s.precision, plan.threads_per_device, false)
                                            : image_model_facts(s.model, s.precision, plan.threads_per_device, false);
  if (s.device_type == DeviceType::cpu) return choose_micro_batch(plan, model, this_host_profile(devices));
  const gpu::GpuState gpus = gpu::Nvml().read(gpu::Nvml::Query{.processes = false});
  if (gpus.devices.empty()) {
    throw UsageError("--micro-batch auto on GPUs reads their memory through NVML, which lists none (" +
                     (gpus.load_error.empty() ? std::string("no GPU") : gpus.load_error) +
                     "): give a number (`lockstep plan --machine` predicts which fit)");
  }
  return choose_micro_batch(plan, model, this_host_gpu_profile(gpus, devices));
}

std::string describe(const MicroBatchChoice& choice) {
  return "micro-batch auto: " + std::to_string(choice.micro_batch) + ", the largest predicted to fit (" +
         memory_text(choice.predicted_bytes) + " of the " + memory_text(choice.device_bytes) +
         " of each device); it is part of the result: give --micro-batch " + std::to_string(choice.micro_batch) +
         " to repeat this run";
}

}  // namespace lockstep::tools
