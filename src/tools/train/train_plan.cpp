#include "tools/train/train_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "lockstep/nn/models.h"
#include "lockstep/optim/schedule.h"
#include "lockstep/parallel/step.h"
#include "tools/common/duration.h"
#include "tools/common/flags.h"
#include "tools/common/gpt_shape.h"
#include "tools/train/train_devices.h"
#include "tools/train/train_recipe.h"

namespace lockstep::tools {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw UsageError(message);
}

// Flag values out of range are usage errors (exit 2), as a flag that does not parse is.
void check_ranges(const TrainOptions& options) {
  require(options.batch_size > 0, "--batch-size must be at least 1, got " + std::to_string(options.batch_size));
  require(options.micro_batch > 0, "--micro-batch must be at least 1, got " + std::to_string(options.micro_batch));
  require(options.bucket_mb > 0, "--bucket-mb must be positive, got " + flag_number(options.bucket_mb));
  require(options.epochs >= 0, "--epochs must be 0 or more, got " + std::to_string(options.epochs));
  require(options.steps >= -1, "--steps must be 0 or more, got " + std::to_string(options.steps));
  require(options.lr > 0 && std::isfinite(options.lr),
          "--lr must be a positive number, got " + flag_number(options.lr));
  require(options.threads >= 0, "--threads must be 1 or more, got " + std::to_string(options.threads));
  require(options.log_every > 0, "--log-every must be at least 1, got " + std::to_string(options.log_every));
  require(options.checkpoint_every >= 0,
          "--checkpoint-every must be 0 (none) or more steps, got " + std::to_string(options.checkpoint_every));
  require(options.keep_checkpoints >= 1,
          "--keep-checkpoints must be at least 1, got " + std::to_string(options.keep_checkpoints));
  require(options.stop_after == -1 || options.stop_after >= 1,
          "--stop-after must be a step, 1 or more, got " + std::to_string(options.stop_after));
  require(options.sample_bytes >= 0, "--sample must be 0 or more bytes, got " + std::to_string(options.sample_bytes));
  require(options.temperature >= 0,
          "--temperature must be 0 (greedy) or more, got " + flag_number(options.temperature));
  require(options.optimizer == "adamw" || options.optimizer == "sgd",
          "--optimizer must be sgd or adamw, got '" + options.optimizer + "'");
  if (!options.lr_schedule.empty()) {
    // A given schedule is checked now; the default one depends on the run's length.
    try {
      optim::parse_schedule(options.lr_schedule);
    } catch (const Error& e) {
      throw UsageError(std::string("--lr-schedule: ") + e.what());
    }
  }
}

void check_model_name(const std::string& model) {
  const std::vector<std::string> images = nn::model_names();
  require(model == "gpt" || std::find(images.begin(), images.end(), model) != images.end(),
          "--model must be cnn, mlp, resnet (Fashion-MNIST) or gpt (text), got '" + model + "'");
}

void check_step_layout(const TrainOptions& options, int replicas) {
  const std::string error = parallel::check_step_layout(options.batch_size, options.micro_batch, replicas);
  if (!error.empty()) throw UsageError(error);
}

int threads_for_process(const TrainOptions& options, int host_cores, int processes_on_host) {
  if (options.threads > 0) return static_cast<int>(options.threads);
  return std::max(1, host_cores / std::max(1, processes_on_host));
}

// dp: every GPU, else a CPU device per core, lowered to as many as can share the step's
// micro-batches (3 cores and 8 micro-batches: 2 devices).
void plan_data_parallel(TrainPlan& plan, const TrainEnvironment& environment) {
  TrainOptions& s = plan.settings;
  if (s.devices == 0) {
    s.devices = s.device_type == DeviceType::cuda ? environment.visible_gpus : environment.host_cores;
    while (s.devices > 1 &&
           !parallel::check_step_layout(s.batch_size, s.micro_batch, static_cast<int>(s.devices)).empty()) {
      --s.devices;
    }
  }
  check_step_layout(s, static_cast<int>(s.devices));
  plan.process_threads = threads_for_process(s, environment.host_cores, 1);
  plan.threads_per_device = std::max(1, plan.process_threads / static_cast<int>(s.devices));
  plan.replicas = static_cast<int>(s.devices);
}

// A launched process on GPUs: rank r's device is cuda:LOCAL_RANK (lockstep run and torchrun
// make the job's GPUs visible to every rank in rank order), and NCCL carries what the ranks
// exchange.
void use_local_gpu(TrainOptions& s, const TrainEnvironment& environment, const std::string& layout) {
  const comm::LaunchInfo& launch = environment.launch;
  require(launch.local_rank < environment.visible_gpus,
          "local rank " + std::to_string(launch.local_rank) + " has no GPU: this process sees " +
              std::to_string(environment.visible_gpus) +
              " GPU(s); start at most that many processes per host, or add --devices cpu");
  if (s.backend == "auto") s.backend = "nccl";
  require(s.backend == "nccl", "--backend " + s.backend + " moves host memory; GPU training under " + layout +
                                   " uses --backend nccl (or add --devices cpu)");
}

// ddp, zero1, zero2 and zero3: this process is one device of a launched job.
void plan_distributed(TrainPlan& plan, const TrainEnvironment& environment) {
  TrainOptions& s = plan.settings;
  const comm::LaunchInfo& launch = environment.launch;
  require(s.devices == 0 || s.devices == launch.world_size,
          "--strategy " + s.strategy + " trains on one device per process: this job has " +
              std::to_string(launch.world_size) + " process(es), not --devices " + std::to_string(s.devices) +
              "; start one process per device (mpirun -n N, torchrun --nproc-per-node N) or leave --devices out");
  s.devices = launch.world_size;
  check_step_layout(s, static_cast<int>(s.devices));
  plan.process_threads = threads_for_process(s, environment.host_cores, launch.local_world_size);
  plan.threads_per_device = plan.process_threads;
  plan.replicas = static_cast<int>(s.devices);
  if (s.device_type == DeviceType::cuda) use_local_gpu(s, environment, "--strategy " + s.strategy);
}

// The mesh: a GPT over dp x tp x pp devices, driven by this process (a thread each) or,
// under a launcher, one device per process.
void plan_mesh(TrainPlan& plan, const TrainEnvironment& environment) {
  TrainOptions& s = plan.settings;
  require(s.model == "gpt",
          "--dp/--tp/--pp (--strategy mesh) cut a GPT's layers and blocks: use --model gpt, or "
          "train --model " +
              s.model + " with --strategy dp, ddp, zero1, zero2 or zero3");
  require(s.tp >= 1 && s.pp >= 1 && s.dp >= 0, "--dp, --tp and --pp must be at least 1, got --dp " +
                                                   std::to_string(s.dp) + " --tp " + std::to_string(s.tp) + " --pp " +
                                                   std::to_string(s.pp));
  const comm::LaunchInfo& launch = environment.launch;
  if (plan.processes > 1) {
    require(s.devices == 0 || s.devices == launch.world_size,
            "under " + launch.launcher + " each process is one device of the mesh: this job has " +
                std::to_string(launch.world_size) + " processes, not --devices " + std::to_string(s.devices));
    s.devices = launch.world_size;
    if (s.device_type == DeviceType::cuda) use_local_gpu(s, environment, "--dp/--tp/--pp");
  }
  const int64_t model_parallel = s.tp * s.pp;
  // One process on GPUs: every GPU it sees, in whole replicas of tp x pp.
  if (plan.processes == 1 && s.device_type == DeviceType::cuda && s.devices == 0 && s.dp == 0) {
    s.dp = std::max<int64_t>(1, environment.visible_gpus / model_parallel);
  }
  if (s.dp == 0) {
    require(s.devices % model_parallel == 0,
            "--devices " + std::to_string(s.devices) +
                " is not a multiple of --tp x --pp = " + std::to_string(model_parallel) + " (devices = dp x tp x pp)");
    s.dp = std::max<int64_t>(1, s.devices / model_parallel);
  }
  parallel::GptMeshOptions& mesh = plan.mesh;
  mesh.mesh = {.dp = static_cast<int>(s.dp), .tp = static_cast<int>(s.tp), .pp = static_cast<int>(s.pp)};
  if (s.devices == 0) s.devices = mesh.mesh.size();
  std::string error = parallel::check_mesh(mesh.mesh, static_cast<int>(s.devices));
  if (!error.empty()) throw UsageError(error);
  require(plan.processes > 1 || s.device_type != DeviceType::cuda || mesh.mesh.size() <= environment.visible_gpus,
          "a mesh of " + mesh.mesh.str() + " needs " + std::to_string(mesh.mesh.size()) + " GPUs, one per rank; " +
              "this process sees " + std::to_string(environment.visible_gpus) +
              " (LOCKSTEP_CUDA_DEVICES_PER_GPU=K splits each GPU into K devices), or add --devices cpu");
  // Each replica's share of micro-batches is a power-of-two run of the step's tree.
  check_step_layout(s, mesh.mesh.dp);
  mesh.micro_batch = s.micro_batch;
  mesh.checkpoint_activations = s.checkpoint_activations;
  mesh.precision = parse_dtype(s.precision);
  try {
    mesh.schedule = parallel::parse_pipeline_schedule(s.schedule);
    if (!s.stages.empty()) mesh.blocks_per_stage = parallel::parse_stage_sizes(s.stages, s.layers, mesh.mesh.pp);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  error = parallel::check_gpt_mesh(plan.gpt, mesh);
  if (!error.empty()) throw UsageError(error);
  const bool processes = plan.processes > 1;
  plan.process_threads = threads_for_process(s, environment.host_cores, processes ? launch.local_world_size : 1);
  plan.threads_per_device = processes ? plan.process_threads : std::max(1, plan.process_threads / mesh.mesh.size());
  plan.replicas = mesh.mesh.dp;
}

}  // namespace

std::string TrainPlan::lr_schedule(int64_t total_steps) const {
  return settings.lr_schedule.empty() ? default_lr_schedule(settings.model, total_steps) : settings.lr_schedule;
}

TrainPlan plan_training(const TrainOptions& flags, const std::function<bool(const std::string&)>& given,
                        const TrainEnvironment& environment) {
  TrainPlan plan;
  TrainOptions& s = plan.settings;
  s = flags;
  // The values that stand for "the default" (-1, 0) are not values a user can give.
  for (const auto& [flag, value, least] : {std::tuple<const char*, int64_t, int64_t>{"micro-batch", s.micro_batch, 1},
                                           {"steps", s.steps, 0},
                                           {"layers", s.layers, 1},
                                           {"heads", s.heads, 1},
                                           {"width", s.width, 1},
                                           {"context", s.context, 1}}) {
    require(!given(flag) || value >= least, "--" + std::string(flag) + " must be " + std::to_string(least) +
                                                " or more (leave it out for the default), got " +
                                                std::to_string(value));
  }
  require(s.resume_dir != "auto" || !s.out_dir.empty(),
          "--resume auto resumes from --out's newest checkpoint: give --out DIR too");
  plan.out_dir = !s.out_dir.empty() ? s.out_dir : !s.resume_dir.empty() ? s.resume_dir : environment.fresh_out_dir;
  if (environment.checkpoint) {
    apply_checkpoint_settings(*environment.checkpoint, environment.checkpoint_path, s, given);
    plan.resume_from = s.resume_dir == "auto" ? s.out_dir : s.resume_dir;
  }
  check_model_name(s.model);
  if (given("dp") || given("tp") || given("pp") || given("schedule") || given("stages")) {
    // --strategy zero1 beside the mesh's flags shards each rank's optimizer state across its
    // data-parallel group (DeepSpeed's ZeRO stage 1 beside Megatron-LM's tensor and pipeline
    // parallelism).
    require(!given("strategy") || (s.strategy != "zero2" && s.strategy != "zero3"),
            "--strategy " + s.strategy +
                " is not built for the mesh (--dp, --tp, --pp, --schedule, --stages): use --strategy zero1 with them "
                "(the optimizer state sharded across each data-parallel group), or --strategy " +
                s.strategy + " without them (ddp, one process per device)");
    require(!given("strategy") || s.strategy == "mesh" || s.strategy == "zero1",
            "--dp, --tp, --pp, --schedule and --stages lay out a mesh; they do not go with --strategy " + s.strategy +
                ": leave --strategy out (or give mesh), or give zero1 to shard the optimizer state across each "
                "data-parallel group");
    if (given("strategy") && s.strategy == "zero1") plan.mesh.zero_stage = 1;
    s.strategy = "mesh";
  }
  require(s.strategy == "dp" || s.strategy == "ddp" || s.strategy == "zero1" || s.strategy == "zero2" ||
              s.strategy == "zero3" || s.strategy == "mesh",
          "--strategy must be dp (one process drives every device), ddp (one process per device), zero1 (ddp with "
          "the optimizer state sharded), zero2 (the gradients too), zero3 (the weights too) or mesh (a GPT over --dp x "
          "--tp x --pp devices), got '" +
              s.strategy + "'");
  const DeviceChoice choice = parse_devices(s.devices_flag, environment.visible_gpus);
  s.devices = choice.count;
  s.device_type = choice.type;
  require(s.precision == "f32" || s.precision == "bf16" || s.precision == "f16",
          "--precision must be f32, bf16 or f16, got '" + s.precision + "'");
  require(s.precision == "f32" || s.device_type == DeviceType::cuda,
          "--precision " + s.precision + " runs on GPU devices; CPU devices compute in f32 (leave --precision out)");
  require(s.grad_dtype == "f32" || s.grad_dtype == "bf16",
          "--grad-dtype must be f32 or bf16, got '" + s.grad_dtype + "'");
  require(s.sync_every >= 1, "--sync-every must be at least 1, got " + std::to_string(s.sync_every));
  require(s.sync_every == 1 || s.strategy == "ddp",
          "--sync-every is local SGD between ddp's processes; this run is --strategy " + s.strategy);
  require(s.sync_every == 1 || s.grad_dtype == "f32",
          "--sync-every sends no gradients, so --grad-dtype has nothing to do: give one of the two");
  require(s.powersgd_rank >= 0 && s.powersgd_rank <= 1024,
          "--powersgd-rank must be 0 (off) to 1024, got " + std::to_string(s.powersgd_rank));
  require(s.powersgd_start >= 0, "--powersgd-start must be 0 or more, got " + std::to_string(s.powersgd_start));
  require(s.powersgd_rank == 0 || (s.strategy == "ddp" && s.device_type == DeviceType::cpu),
          "--powersgd-rank is for --strategy ddp on CPU devices; this run is --strategy " + s.strategy);
  require(s.powersgd_rank == 0 || (s.sync_every == 1 && s.grad_dtype == "f32"),
          "--powersgd-rank combines with neither --sync-every nor --grad-dtype: give one of them");
  require(s.grad_dtype == "f32" || (s.strategy == "ddp" && s.device_type == DeviceType::cpu),
          "--grad-dtype bf16 is for --strategy ddp on CPU devices, where gradients cross a network; this run is "
          "--strategy " +
              s.strategy + (s.device_type == DeviceType::cuda ? " on GPUs" : ""));
  require(!s.offload_optimizer || s.strategy != "mesh",
          "--offload-optimizer keeps the optimizer state of --strategy dp, ddp and zero1-3 in host memory; the mesh "
          "(--dp/--tp/--pp) steps its optimizer on its devices");
  plan.offload_optimizer = s.offload_optimizer && s.device_type == DeviceType::cuda;
  plan.offload_ignored = s.offload_optimizer && !plan.offload_optimizer;
  // After the checkpoint's settings: a resumed run keeps the optimizer it had.
  if (s.optimizer.empty()) s.optimizer = kDefaultOptimizer;
  // -1 stands for "the optimizer's default": a negative --lr must not pass for it.
  require(!given("lr") || s.lr > 0, "--lr must be a positive number, got " + flag_number(s.lr));
  if (s.lr < 0) s.lr = default_lr(s.model, s.optimizer);
  require(!given("label-smoothing") || (s.label_smoothing >= 0 && s.label_smoothing <= 1),
          "--label-smoothing must lie in [0, 1], got " + flag_number(s.label_smoothing));
  require(!given("label-smoothing") || s.model != "gpt" || s.label_smoothing == 0,
          "--label-smoothing is for the Fashion-MNIST models (cnn, mlp, resnet); the GPT's next-byte loss has none");
  if (s.label_smoothing < 0) s.label_smoothing = default_label_smoothing(s.model);
  if (s.micro_batch < 0) s.micro_batch = default_micro_batch(s.model, s.batch_size);
  check_ranges(s);
  if (s.model == "gpt") {
    plan.gpt =
        gpt_shape({.preset = s.preset, .layers = s.layers, .heads = s.heads, .width = s.width, .context = s.context});
    // The resolved shape, for the checkpoint: a resume needs no shape flags.
    s.layers = plan.gpt.layers;
    s.heads = plan.gpt.heads;
    s.width = plan.gpt.width;
    s.context = plan.gpt.context;
    // Shapes from flags or from a checkpoint's metadata: one that cannot fit is refused here,
    // not after minutes of allocating its blocks.
    const double parameters = nn::gpt_parameter_count(plan.gpt);
    const double memory = static_cast<double>(environment.host_memory_bytes);
    if (memory > 0 && parameters * 4 > memory) {
      char text[160];
      std::snprintf(text, sizeof(text),
                    "has %.3g parameters, %.1f GiB in f32 for its weights alone, more than this "
                    "host's %.1f GiB of memory",
                    parameters, parameters * 4 / (1 << 30), memory / (1 << 30));
      throw UsageError("--model gpt with " + std::to_string(plan.gpt.layers) + " layers of width " +
                       std::to_string(plan.gpt.width) + " " + text + ": use fewer --layers or a smaller --width");
    }
  }

  const bool launched = environment.launch.world_size > 1;
  if (s.strategy == "dp") {
    plan_data_parallel(plan, environment);
  } else if (s.strategy == "mesh") {
    plan.processes = launched ? environment.launch.world_size : 1;
    plan_mesh(plan, environment);
  } else {
    plan.processes = environment.launch.world_size;
    plan_distributed(plan, environment);
  }
  plan.rank = plan.processes > 1 ? environment.launch.rank : 0;
  plan.local_rank = plan.processes > 1 ? environment.launch.local_rank : 0;
  plan.leader = plan.rank == 0;
  plan.accumulation = s.batch_size / s.micro_batch / plan.replicas;
  if (!s.checkpoint_interval.empty()) {
    plan.checkpoint_interval_seconds = parse_duration("checkpoint-interval", s.checkpoint_interval);
  }
  return plan;
}

}  // namespace lockstep::tools
