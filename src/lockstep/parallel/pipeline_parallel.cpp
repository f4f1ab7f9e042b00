#include "lockstep/parallel/pipeline_parallel.h"

namespace lockstep::parallel {

PipelineParallel::PipelineParallel(const SequentialPipelineOptions& options, const MakeModel& make_model,
                                   const OptimizerFactory& make_optimizer, int threads_per_device,
                                   DeviceType device_type)
    : micro_batch_(options.micro_batch) {
  LOCKSTEP_CHECK(options.replicas >= 1 && options.stages >= 1)
      << "a pipeline needs at least one replica and one stage, got " << options.replicas << " x " << options.stages;
  const int size = options.replicas * options.stages;
  local_ = std::make_unique<LocalRanks>(first_devices(device_type, size), threads_per_device);
  ranks_.resize(static_cast<size_t>(size));
  // Construction is collective (the mesh's groups), so every rank builds its own at once.
  local_->run([&](int r) {
    ranks_[static_cast<size_t>(r)] = std::make_unique<SequentialPipelineRank>(make_model(), options, local_->comm(r),
                                                                              local_->device(r), make_optimizer);
  });
}

PipelineParallel::~PipelineParallel() = default;

StepResult PipelineParallel::step(const TensorBatch& global_batch, const StepContext& context) {
  std::vector<StepResult> results(ranks_.size());
  local_->run(
      [&](int r) { results[static_cast<size_t>(r)] = ranks_[static_cast<size_t>(r)]->step(global_batch, context); });
  return merge_rank_results(results);
}

nn::Module& PipelineParallel::model() {
  local_->run([&](int r) { ranks_[static_cast<size_t>(r)]->gather_full(); });
  return ranks_[0]->model();
}

void PipelineParallel::load_model_state(const NamedTensors& state) {
  for (const auto& rank : ranks_) rank->model().load_state_dict(state);
}

void PipelineParallel::set_lr(double lr) {
  for (const auto& rank : ranks_) rank->optimizer().set_lr(lr);
}

double PipelineParallel::lr() const { return ranks_[0]->optimizer().lr(); }

NamedTensors PipelineParallel::optimizer_state() {
  std::vector<NamedTensors> gathered(ranks_.size());
  local_->run(
      [&](int r) { gathered[static_cast<size_t>(r)] = ranks_[static_cast<size_t>(r)]->gather_full_optimizer_state(); });
  return gathered[0];
}

void PipelineParallel::load_optimizer_state(const NamedTensors& state) {
  for (const auto& rank : ranks_) rank->load_full_optimizer_state(state);
}

}  // namespace lockstep::parallel
