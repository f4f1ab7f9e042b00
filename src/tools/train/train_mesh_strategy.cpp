// `lockstep train --model gpt --dp D --tp T --pp P`: a GPT on a D x T x P device mesh, each
// device one rank (parallel/gpt_mesh.h); with --strategy zero1, each rank's optimizer state
// is sharded across its data-parallel group (GptMeshOptions::zero_stage 1). Started alone,
// this process drives every device (CPU devices, or its GPUs), a worker thread each over a
// `local` group (`nccl` between GPUs of their own); started by a launcher (lockstep run,
// torchrun, mpirun) with a world of D x T x P processes, each process is one device (on GPUs
// its local rank's, over nccl). Checkpoints hold the full model and the unsharded optimizer state,
// so a run resumes under any layout, or under plain data parallelism.
#include "lockstep/comm/init.h"
#include "lockstep/core/device.h"
#include "lockstep/data/text_dataset.h"
#include "lockstep/parallel/gpt_mesh_parallel.h"
#include "tools/train/train_strategy.h"

namespace lockstep::tools {
namespace {

class MeshStrategy final : public TrainStrategy {
 public:
  // world: this process's rank of a launched job, or null to drive every device here.
  MeshStrategy(const TrainPlan& plan, std::shared_ptr<comm::Communicator> world, const ReplicaFactory& make_replica,
               const OptimizerFactory& make_optimizer)
      : layout_(plan.mesh),
        type_(plan.settings.device_type),
        world_(world),
        mesh_(
            {.mesh = plan.mesh,
             .tokens = kTokensField,
             .targets = kTargetsField,
             .threads_per_device = plan.threads_per_device,
             .world = world,
             // Under a launcher: this process's device, on GPUs its local rank's.
             .devices =
                 world ? std::vector<Device>{type_ == DeviceType::cuda ? Device(type_, plan.local_rank) : Device::cpu()}
                       : parallel::first_devices(type_, plan.mesh.mesh.size())},
            [make_replica] {
              std::shared_ptr<nn::Gpt> gpt = std::dynamic_pointer_cast<nn::Gpt>(make_replica());
              LOCKSTEP_CHECK(gpt != nullptr) << "--strategy mesh trains a GPT (--model gpt)";
              return gpt;
            },
            make_optimizer) {}

  parallel::Layout& layout() override { return mesh_; }
  int64_t optimizer_state_bytes() const override { return mesh_.ranks()[0]->optimizer().state_bytes(); }

  // Named by rank, as ddp names its processes' devices.
  std::vector<std::string> local_devices() const override {
    return world_ ? device_names(type_, world_->rank(), 1) : all_devices();
  }
  std::vector<std::string> all_devices() const override { return device_names(type_, 0, layout_.mesh.size()); }
  std::vector<Device> local_allocators() const override { return mesh_.local_devices(); }
  std::vector<DeviceTotals> gather(const std::vector<DeviceTotals>& local) override {
    return world_ ? gather_device_totals(*world_, local.at(0)) : local;
  }
  void barrier() override {
    if (world_) world_->barrier();
  }
  nlohmann::json collectives_json() const override {
    const comm::Communicator& world = mesh_.world();
    return {{"backend", world.backend()}, {"route", world.route()}};
  }

  std::string layout_report(const std::vector<DeviceTotals>& totals) const override {
    const nlohmann::json j = layout_json(totals);
    std::string out = "mesh " + layout_.mesh.str() + ": device d is tp d mod T, dp (d / T) mod D, pp d / (T x D)\n";
    if (layout_.zero_stage == 1) {
      out += std::string("zero1: each rank holds 1/") + std::to_string(layout_.mesh.dp) +
             " of its parameters' optimizer state, the rest on the other replicas of its stage and shard\n";
    }
    if (layout_.mesh.pp == 1) return out;
    char line[320];
    std::snprintf(line, sizeof(line),
                  "pipeline %s, %d stages x %lld micro-batches: bubble %.1f%% measured (mean over devices) against "
                  "%.1f%% in theory, (P-1)/(M+P-1); blocks per stage %s; at most %lld micro-batches of activations "
                  "held\n",
                  parallel::pipeline_schedule_name(layout_.schedule), layout_.mesh.pp,
                  static_cast<long long>(j["micro_batches"].get<int64_t>()), 100 * j["bubble_measured"].get<double>(),
                  100 * j["bubble_theory"].get<double>(), j["blocks_per_stage"].dump().c_str(),
                  static_cast<long long>(j["most_in_flight"].get<int64_t>()));
    return out + line;
  }

  nlohmann::json layout_json(const std::vector<DeviceTotals>& totals) const override {
    double bubble = 0, busy = 0;
    for (const DeviceTotals& t : totals) {
      bubble += t.times.bubble;
      busy += t.times.busy();
    }
    // A stage holds at most as many micro-batches as the first stage, which holds the most.
    int64_t most = 0;
    for (const auto& rank : mesh_.ranks()) most = std::max(most, rank->most_in_flight());
    const int64_t micro_batches = mesh_.ranks()[0]->micro_batches();
    return {{"dp", layout_.mesh.dp},
            {"tp", layout_.mesh.tp},
            {"pp", layout_.mesh.pp},
            {"zero_stage", layout_.zero_stage},
            {"processes", world_ ? world_->size() : 1},
            {"schedule", parallel::pipeline_schedule_name(layout_.schedule)},
            {"blocks_per_stage", mesh_.ranks()[0]->blocks_per_stage()},
            {"micro_batches", micro_batches},
            {"bubble_measured", busy > 0 ? bubble / busy : 0.0},
            {"bubble_theory", parallel::theoretical_bubble(layout_.mesh.pp, micro_batches)},
            {"most_in_flight", most}};
  }

 private:
  parallel::GptMeshOptions layout_;
  DeviceType type_;
  std::shared_ptr<comm::Communicator> world_;
  parallel::GptMeshParallel mesh_;
};

}  // namespace

std::unique_ptr<TrainStrategy> make_mesh_strategy(const TrainPlan& plan, const ReplicaFactory& make_replica,
                                                  const OptimizerFactory& make_optimizer) {
  // Under a launcher every process is one device of the mesh.
  std::shared_ptr<comm::Communicator> world =
      plan.processes > 1 ? comm::init_process_group(plan.settings.backend) : nullptr;
  return std::make_unique<MeshStrategy>(plan, std::move(world), make_replica, make_optimizer);
}

}  // namespace lockstep::tools
