#include "lockstep/parallel/gpt_mesh_parallel.h"

namespace lockstep::parallel {

GptMeshParallel::GptMeshParallel(const GptMeshParallelOptions& options, const MakeModel& make_model,
                                 const OptimizerFactory& make_optimizer)
    : options_(options), make_model_(make_model) {
  const int size = options.mesh.mesh.size();
  const int here = options.world ? 1 : size;
  devices_ = options.devices.empty() ? first_devices(DeviceType::cpu, here) : options.devices;
  LOCKSTEP_CHECK(static_cast<int>(devices_.size()) == here)
      << "GptMeshParallel: " << devices_.size() << " device(s) given for the " << here << " rank(s) of a mesh of "
      << options.mesh.mesh.str() << " that this process drives; give one device per rank";
  if (options.world) {
    LOCKSTEP_CHECK(options.world->size() == size)
        << "a mesh of " << options.mesh.mesh.str() << " needs " << size << " ranks, but the job has "
        << options.world->size() << " processes";
  } else {
    local_ = std::make_unique<LocalRanks>(devices_, options.threads_per_device);
  }
  // Every rank cuts its part from one full model, which goes once they have.
  const std::shared_ptr<nn::Gpt> full = make_model();
  ranks_.resize(static_cast<size_t>(here));
  run_local([&](int i) {
    ranks_[static_cast<size_t>(i)] =
        std::make_unique<GptMeshRank>(*full, options.mesh, local_ ? local_->comm(i) : options.world,
                                      devices_[static_cast<size_t>(i)], make_optimizer);
  });
}

GptMeshParallel::~GptMeshParallel() = default;

void GptMeshParallel::run_local(const std::function<void(int)>& task) {
  if (local_) {
    local_->run(task);
  } else {
    task(0);
  }
}

StepResult GptMeshParallel::step(const TensorBatch& global_batch, const StepContext& context) {
  check_batch_has_samples("GptMeshParallel", global_batch);
  std::vector<StepResult> outcomes(ranks_.size());
  run_local([&](int i) {
    outcomes[static_cast<size_t>(i)] =
        ranks_[static_cast<size_t>(i)]->step(global_batch.at(options_.tokens), global_batch.at(options_.targets),
                                             context.first_sample, context.step, context.seed);
  });
  return merge_rank_results(outcomes);
}

nn::Module& GptMeshParallel::model() {
  std::vector<NamedTensors> weights(ranks_.size());
  run_local([&](int i) { weights[static_cast<size_t>(i)] = ranks_[static_cast<size_t>(i)]->gather_full_weights(); });
  gathered_ = make_model_();
  gathered_->load_state_dict(weights[0]);
  return *gathered_;
}

nn::Module* GptMeshParallel::model_on(int root) {
  std::vector<NamedTensors> weights(ranks_.size());
  run_local(
      [&](int i) { weights[static_cast<size_t>(i)] = ranks_[static_cast<size_t>(i)]->gather_full_weights_on(root); });
  // Under a launcher this process is one rank; else every rank is here, root among them.
  const NamedTensors& full = weights[options_.world ? 0 : static_cast<size_t>(root)];
  if (full.empty()) return nullptr;
  gathered_on_root_ = make_model_();
  gathered_on_root_->load_state_dict(full);
  return gathered_on_root_.get();
}

void GptMeshParallel::load_model_state(const NamedTensors& state) {
  for (const auto& rank : ranks_) rank->load_full_weights(state);
}

void GptMeshParallel::set_lr(double lr) {
  for (const auto& rank : ranks_) rank->optimizer().set_lr(lr);
}

double GptMeshParallel::lr() const { return ranks_[0]->optimizer().lr(); }

NamedTensors GptMeshParallel::optimizer_state() {
  std::vector<NamedTensors> states(ranks_.size());
  run_local(
      [&](int i) { states[static_cast<size_t>(i)] = ranks_[static_cast<size_t>(i)]->gather_full_optimizer_state(); });
  return states[0];
}

NamedTensors GptMeshParallel::optimizer_state_on(int root) {
  std::vector<NamedTensors> states(ranks_.size());
  run_local([&](int i) {
    states[static_cast<size_t>(i)] = ranks_[static_cast<size_t>(i)]->gather_full_optimizer_state_on(root);
  });
  return states[options_.world ? 0 : static_cast<size_t>(root)];
}

void GptMeshParallel::load_optimizer_state(const NamedTensors& state) {
  for (const auto& rank : ranks_) rank->load_full_optimizer_state(state);
}

int64_t GptMeshParallel::max_over_processes(int64_t value) {
  if (!options_.world) return value;  // every rank is a thread of this process
  const Tensor flag = Tensor::from_vector(std::vector<double>{static_cast<double>(value)}, {1});
  options_.world->all_reduce(flag, comm::ReduceOp::max);
  return static_cast<int64_t>(flag.item());
}

void GptMeshParallel::give_up(const std::string& reason) {
  if (options_.world) options_.world->abort("rank " + std::to_string(options_.world->rank()) + ": " + reason);
}

}  // namespace lockstep::parallel
