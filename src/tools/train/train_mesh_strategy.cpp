// `lockstep train --model gpt --dp D --tp T --pp P`: a GPT on a D x T x P device mesh, each
// device one rank (parallel/gpt_mesh.h). Started alone, this process drives every device,
// a worker thread each over a `local` group; started by a launcher (lockstep run, torchrun,
// mpirun) with a world of D x T x P processes, each process is one device. Checkpoints hold
// the full model and the unsharded optimizer state, so a run resumes under any layout, or
// under plain data parallelism.
#include "lockstep/comm/init.h"
#include "lockstep/comm/launch_env.h"
#include "lockstep/core/device.h"
#include "lockstep/data/text_dataset.h"
#include "lockstep/parallel/gpt_mesh_parallel.h"
#include "tools/common/flags.h"
#include "tools/train/train_strategy.h"

namespace lockstep::tools {
namespace {

class MeshStrategy final : public TrainStrategy {
 public:
  // world: this process's rank of a launched job, or null to drive every device here.
  MeshStrategy(const parallel::GptMeshOptions& layout, int threads, std::shared_ptr<comm::Communicator> world,
               const ReplicaFactory& make_replica, const OptimizerFactory& make_optimizer)
      : layout_(layout),
        threads_(threads),
        world_(world),
        mesh_(
            {.mesh = layout,
             .tokens = kTokensField,
             .targets = kTargetsField,
             .threads_per_device = world ? threads : std::max(1, threads / layout.mesh.size()),
             .world = world},
            [make_replica] {
              std::shared_ptr<nn::Gpt> gpt = std::dynamic_pointer_cast<nn::Gpt>(make_replica());
              LOCKSTEP_CHECK(gpt != nullptr) << "--strategy mesh trains a GPT (--model gpt)";
              return gpt;
            },
            make_optimizer) {}

  parallel::StepResult step(const Batch& batch, uint64_t step, uint64_t seed) override {
    return mesh_.step(batch.samples, {.seed = seed, .step = step, .first_sample = batch.first_position});
  }
  nn::Module& model() override { return mesh_.model(); }
  void set_lr(double lr) override { mesh_.set_lr(lr); }
  double lr() const override { return mesh_.lr(); }
  NamedTensors optimizer_state() override { return mesh_.optimizer_state(); }
  int64_t optimizer_state_bytes() const override { return mesh_.ranks()[0]->optimizer().state_bytes(); }
  RunPosition restore(const Checkpoint& checkpoint, const std::string& path) override {
    nn::Module& full = mesh_.model();  // a model of the full shape to check the checkpoint against
    NamedTensors optimizer_state;
    const RunPosition position =
        restore_train_checkpoint(checkpoint, path, full, [&](const NamedTensors& state) { optimizer_state = state; });
    mesh_.load_model_state(full.state_dict());
    mesh_.load_optimizer_state(optimizer_state);
    return position;
  }

  std::vector<std::string> local_devices() const override {
    return world_ ? cpu_device_names(world_->rank(), 1) : all_devices();
  }
  std::vector<std::string> all_devices() const override { return cpu_device_names(0, layout_.mesh.size()); }
  std::vector<Device> local_allocators() const override { return mesh_.local_devices(); }
  int threads_per_device() const override { return world_ ? threads_ : std::max(1, threads_ / layout_.mesh.size()); }
  int process_threads() const override { return threads_; }
  bool leader() const override { return !world_ || world_->rank() == 0; }
  std::vector<DeviceTotals> gather(const std::vector<DeviceTotals>& local) override {
    return world_ ? gather_device_totals(*world_, local.at(0)) : local;
  }
  void barrier() override {
    if (world_) world_->barrier();
  }

  std::string layout_report(const std::vector<DeviceTotals>& totals) const override {
    const nlohmann::json j = layout_json(totals);
    std::string out = "mesh " + layout_.mesh.str() + ": device d is tp d mod T, dp (d / T) mod D, pp d / (T x D)\n";
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
  int threads_;
  std::shared_ptr<comm::Communicator> world_;
  parallel::GptMeshParallel mesh_;
};

}  // namespace

std::unique_ptr<TrainStrategy> make_mesh_strategy(TrainOptions& options, const ReplicaFactory& make_replica,
                                                  const OptimizerFactory& make_optimizer) {
  if (options.model != "gpt") {
    throw UsageError(
        "--dp/--tp/--pp (--strategy mesh) cut a GPT's layers and blocks: use --model gpt, or train --model " +
        options.model + " with --strategy dp, ddp or zero1");
  }
  if (options.tp < 1 || options.pp < 1 || options.dp < 0) {
    throw UsageError("--dp, --tp and --pp must be at least 1, got --dp " + std::to_string(options.dp) + " --tp " +
                     std::to_string(options.tp) + " --pp " + std::to_string(options.pp));
  }
  // Under a launcher every process is one device of the mesh.
  const comm::LaunchInfo launch = comm::launch_info_from_env();
  const bool processes = launch.world_size > 1;
  if (processes) {
    if (options.devices != 0 && options.devices != launch.world_size) {
      throw UsageError("under " + launch.launcher + " each process is one device of the mesh: this job has " +
                       std::to_string(launch.world_size) + " processes, not --devices " +
                       std::to_string(options.devices));
    }
    options.devices = launch.world_size;
  }
  const int64_t model_parallel = options.tp * options.pp;
  if (options.dp == 0) {
    if (options.devices % model_parallel != 0) {
      throw UsageError("--devices " + std::to_string(options.devices) + " is not a multiple of --tp x --pp = " +
                       std::to_string(model_parallel) + " (devices = dp x tp x pp)");
    }
    options.dp = std::max<int64_t>(1, options.devices / model_parallel);
  }
  parallel::GptMeshOptions layout;
  layout.mesh = {
      .dp = static_cast<int>(options.dp), .tp = static_cast<int>(options.tp), .pp = static_cast<int>(options.pp)};
  if (options.devices == 0) options.devices = layout.mesh.size();
  std::string error = parallel::check_mesh(layout.mesh, static_cast<int>(options.devices));
  if (!error.empty()) throw UsageError(error);
  // Each replica's share of micro-batches is a power-of-two run of the step's tree.
  error = parallel::check_step_layout(options.batch_size, options.micro_batch, layout.mesh.dp);
  if (!error.empty()) throw UsageError(error);
  layout.micro_batch = options.micro_batch;
  layout.checkpoint_activations = options.checkpoint_activations;
  try {
    layout.schedule = parallel::parse_pipeline_schedule(options.schedule);
    if (!options.stages.empty()) {
      layout.blocks_per_stage = parallel::parse_stage_sizes(options.stages, options.layers, layout.mesh.pp);
    }
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  error = parallel::check_gpt_mesh(
      nn::GptConfig{
          .context = options.context, .layers = options.layers, .heads = options.heads, .width = options.width},
      layout);
  if (!error.empty()) throw UsageError(error);
  if (!processes)
    return std::make_unique<MeshStrategy>(layout, threads_for_process(options, 1), nullptr, make_replica,
                                          make_optimizer);
  return std::make_unique<MeshStrategy>(layout, threads_for_process(options, launch.local_world_size),
                                        comm::init_process_group(options.backend), make_replica, make_optimizer);
}

}  // namespace lockstep::tools
