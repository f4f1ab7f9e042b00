// `lockstep train`: trains a built-in model on every local device — a classifier on
// Fashion-MNIST, or a GPT on byte-level text (train_task.h) — with progress on stderr,
// metrics.jsonl / checkpoint.safetensors / summary.json under --out, the per-device time
// table on stderr, and the test accuracy (the GPT: validation loss and a sample) on stdout.
// Parse, plan (train_plan.h), run (train::Trainer on the plan's layout), report. Every run,
// one device or many, takes the same tree-shaped step, so `weights_sha256` depends on
// (seed, batch, micro-batch) and not on the device count.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "lockstep/comm/launch_env.h"
#include "lockstep/core/allocator.h"
#include "lockstep/core/cuda_device.h"
#include "lockstep/core/parallel.h"
#include "lockstep/data/fashion_mnist.h"
#include "lockstep/data/text_dataset.h"
#include "lockstep/io/checkpoint.h"
#include "lockstep/nn/models.h"
#include "lockstep/obs/json_lines.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/parallel/optimizer_offload.h"
#include "lockstep/train/checkpoint_folder.h"
#include "lockstep/train/stop_signals.h"
#include "lockstep/train/trainer.h"
#include "tools/common/commands.h"
#include "tools/common/flags.h"
#include "tools/common/run_dir.h"
#include "tools/train/auto_micro_batch.h"
#include "tools/train/device_report.h"
#include "tools/train/printable_text.h"
#include "tools/train/state_mismatch.h"
#include "tools/train/train_plan.h"
#include "tools/train/train_recipe.h"
#include "tools/train/train_strategy.h"
#include "tools/train/train_task.h"

namespace lockstep::tools {
namespace {

namespace fs = std::filesystem;

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

// Mean loss and accuracy over every prediction: one per image, or one per position of a
// text window (next-byte accuracy), `batch` samples at a time.
Evaluation evaluate_in_batches(nn::Module& model, const TensorDataset& data, const std::string& input_field,
                               const std::string& target_field, int64_t batch) {
  const Tensor& inputs = data[input_field];
  const Tensor& targets = data[target_field];
  const int64_t n = data.size();
  const int64_t per_sample = n > 0 ? targets.numel() / n : 1;
  double loss_sum = 0;
  int64_t correct = 0;
  const Device device = model.parameters().front().device();
  for (int64_t start = 0; start < n; start += batch) {
    const int64_t end = std::min(n, start + batch);
    // [predictions, classes], scored on the host
    const Tensor flat_logits = flatten(model(slice(inputs, 0, start, end).to(device)), 0, -2).to(Device::cpu());
    const Tensor labels = flatten(slice(targets, 0, start, end).contiguous(), 0);
    loss_sum += cross_entropy(flat_logits, labels, Reduction::sum).item();
    const auto predicted = argmax(flat_logits, 1).to_vector<int64_t>();
    const auto truth = labels.to_vector<int64_t>();
    for (size_t i = 0; i < predicted.size(); ++i) correct += predicted[i] == truth[i];
  }
  const double total = static_cast<double>(n * per_sample);
  return {n ? loss_sum / total : 0.0, n ? static_cast<double>(correct) / total : 0.0};
}

// About a thousand predictions at a time, and half as many each time that runs out of memory
// (evaluation's activations are not the training step's, which the micro-batch sized: a
// device given a GPU's memory can hold a step and not a thousand images' forward).
Evaluation evaluate(nn::Module& model, const TensorDataset& data, const std::string& input_field,
                    const std::string& target_field) {
  NoGradGuard no_grad;
  model.eval();
  struct BackToTraining {
    nn::Module& model;
    ~BackToTraining() { model.train(); }
  } back{model};
  const int64_t n = data.size();
  const int64_t per_sample = n > 0 ? data[target_field].numel() / n : 1;
  for (int64_t batch = std::max<int64_t>(1, 1000 / per_sample);; batch /= 2) {
    try {
      return evaluate_in_batches(model, data, input_field, target_field, batch);
    } catch (const OutOfMemoryError& e) {
      if (batch == 1) throw;
      const std::string what = e.what();  // its first clause: where, and how much was asked for
      std::fprintf(stderr, "lockstep train: evaluating %lld samples at a time ran %s; taking %lld\n",
                   static_cast<long long>(batch), what.substr(0, what.find(';')).c_str(),
                   static_cast<long long>(batch / 2));
    }
  }
}

// The sample a trained GPT writes, starting a new fortune ("%\n" ends the one before).
std::string sample_text(nn::Module& model, const TrainOptions& options) {
  if (options.sample_bytes <= 0) return "";
  const std::string prompt = "%\n";
  const std::vector<int64_t> tokens =
      nn::generate(dynamic_cast<nn::Gpt&>(model), std::vector<int64_t>(prompt.begin(), prompt.end()),
                   options.sample_bytes, options.temperature, options.seed);
  std::string bytes;
  for (int64_t t : tokens) bytes += static_cast<char>(t);
  // The model emits bytes, not always whole UTF-8 characters, and may emit control bytes.
  return printable_text(bytes);
}

// The plan's optimizer (sgd or adamw: the plan checked the name).
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& options, std::vector<Tensor> params) {
  if (options.optimizer == "sgd") {
    return std::make_unique<optim::SGD>(
        std::move(params),
        optim::SGDOptions{.lr = options.lr, .momentum = options.momentum, .weight_decay = options.weight_decay});
  }
  return std::make_unique<optim::AdamW>(std::move(params),
                                        optim::AdamWOptions{.lr = options.lr, .weight_decay = options.weight_decay});
}

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

// Per device of this process, keyed by its name: the allocator's figures now.
nlohmann::json memory_json(const std::vector<std::string>& names, const std::vector<Device>& allocators) {
  nlohmann::json out = nlohmann::json::object();
  for (size_t d = 0; d < allocators.size(); ++d) {
    const MemoryStats stats = memory_stats(allocators[d]);
    out[names.at(d)] = {{"allocated_bytes", stats.allocated_bytes},
                        {"peak_allocated_bytes", stats.peak_allocated_bytes},
                        {"reserved_bytes", stats.reserved_bytes}};
  }
  return out;
}

TrainEnvironment environment_of(const TrainOptions& flags) {
  TrainEnvironment environment{
      .launch = comm::launch_info_from_env(),
      .visible_gpus = cuda::device_count(),
      .host_cores = host_cores(),
      .host_memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE)};
  if (!flags.resume_dir.empty()) {
    // "auto": --out's checkpoint if it has one (a first start has none); else the folder's.
    const bool automatic = flags.resume_dir == "auto";
    const std::string dir = automatic ? flags.out_dir : flags.resume_dir;
    if (const auto newest = dir.empty() ? std::nullopt : train::CheckpointFolder::newest_metadata(dir)) {
      environment.checkpoint_path = newest->first;
      environment.checkpoint = newest->second;
    } else {
      LOCKSTEP_CHECK(automatic) << "--resume " << dir << ": no checkpoint in that folder ("
                                << train::Trainer::kCheckpointFile << " or checkpoint-<step>.safetensors)";
    }
  }
  if (flags.out_dir.empty() && flags.resume_dir.empty()) environment.fresh_out_dir = fresh_run_dir();
  return environment;
}

// --init's weights: a file of the model's state_dict (PyTorch's names), or a Trainer's
// checkpoint (its tensors checked against their hash), whose "model." entries are the model's.
std::shared_ptr<const TensorFile> init_weights(const std::string& path) {
  if (path.empty()) return nullptr;
  auto file = std::make_shared<TensorFile>(load_checkpoint(path));
  if (file->metadata.contains("step") && file->metadata.contains("sample")) {
    NamedTensors model;
    for (auto& [name, tensor] : file->tensors)
      if (name.rfind("model.", 0) == 0) model.emplace_back(name.substr(6), std::move(tensor));
    file->tensors = std::move(model);
  }
  return file;
}

// The plan's model, its --init weights loaded, for each replica.
ReplicaFactory replica_factory(const TrainPlan& plan, const TrainTask& task) {
  const std::shared_ptr<const TensorFile> init = init_weights(plan.settings.init_file);
  return [&plan, &task, init] {
    std::shared_ptr<nn::Module> replica = task.make_model();
    if (init) {
      try {
        replica->load_state_dict(init->tensors);
      } catch (const Error& e) {
        // One line that says what differs; the library's report has a line per key.
        const std::string differs = describe_state_mismatch(init->tensors, replica->state_dict());
        LOCKSTEP_FAIL() << "--init " << plan.settings.init_file << " does not fit model '" << plan.settings.model
                        << "': " << (differs.empty() ? std::string(e.what()) : differs)
                        << " (weights of another model, or another shape flag?)";
      }
    }
    return replica;
  };
}

// trainer.fit(), its out-of-memory error told which flags help.
train::TrainSummary fit(train::Trainer& trainer, const TrainOptions& settings) {
  try {
    return trainer.fit();
  } catch (const OutOfMemoryError& e) {
    if (settings.micro_batch_auto) throw;  // it halved what it could
    throw OutOfMemoryError(std::string(e.what()) + "; --micro-batch " + std::to_string(settings.micro_batch) +
                           " is too large for this device: give a smaller one, or --micro-batch auto, which halves "
                           "it when a step runs out of memory");
  }
}

// Runs the plan: builds its layout, trains it with the Trainer, and reports. Every process
// of a launched job runs it; the leader writes the files and prints.
int run_training(const TrainPlan& plan) {
  const TrainOptions& settings = plan.settings;
  const TrainTask task = make_train_task(plan);
  parallel::OptimizerFactory optimizer_factory = [&](std::vector<Tensor> params) {
    return make_optimizer(settings, std::move(params));
  };
  if (plan.offload_optimizer) optimizer_factory = parallel::offload_optimizer(std::move(optimizer_factory));
  if (plan.offload_ignored && plan.leader)
    std::fprintf(stderr,
                 "lockstep train: --offload-optimizer does nothing on CPU devices: their optimizer state is in host "
                 "memory already\n");
  const std::unique_ptr<TrainStrategy> strategy =
      make_train_strategy(plan, task.loss, replica_factory(plan, task), optimizer_factory);
  const bool quiet = settings.quiet || !plan.leader;
  set_num_threads(plan.process_threads);  // evaluation runs on this thread
  if (settings.micro_batch_auto && plan.leader) {
    // Asking for the micro-batch it has changes nothing, and says whether the layout could
    // take a step again with another (layout.h): where not, the user hears it before a step
    // runs out, not only when one does.
    const std::string fixed = strategy->layout().set_micro_batch(settings.micro_batch, settings.batch_size);
    if (!fixed.empty())
      std::fprintf(stderr,
                   "lockstep train: --micro-batch auto: --strategy %s cannot take a step that runs out of memory again "
                   "with half the micro-batch (%s): such a step ends the run\n",
                   settings.strategy.c_str(), fixed.c_str());
  }

  // Short last batches are dropped (the Trainer's data order): an epoch is whole batches.
  const int64_t total_steps =
      settings.steps >= 0 ? settings.steps : settings.epochs * (task.train->size() / settings.batch_size);
  train::Trainer trainer(strategy->layout(), task.train,
                         {.batch_size = settings.batch_size,
                          .steps = total_steps,
                          .seed = settings.seed,
                          .lr = settings.lr,
                          .lr_schedule = plan.lr_schedule(total_steps),
                          .out_dir = plan.out_dir,
                          .resume = plan.resume_from.empty() ? "none" : plan.resume_from,
                          .checkpoint_every = settings.checkpoint_every,
                          .checkpoint_interval_seconds = plan.checkpoint_interval_seconds,
                          .keep_checkpoints = static_cast<int>(settings.keep_checkpoints),
                          .stop_at_step = settings.stop_after,
                          .stop_on_signals = true,
                          .recipe = train_recipe(settings),
                          .write_summary = false,
                          .log_every = settings.log_every,
                          .progress = !quiet,
                          .halve_micro_batch_on_out_of_memory = settings.micro_batch_auto,
                          .leader = plan.leader});

  const std::vector<std::string> device_names = strategy->all_devices();
  const std::vector<std::string> local_names = strategy->local_devices();
  const std::vector<Device> allocators = strategy->local_allocators();
  DeviceReport report(local_names, settings.trace_file, plan.rank, plan.processes);
  int64_t skipped_steps = 0;
  std::vector<DeviceTotals> local_totals;
  trainer.on_start = [&](int64_t first_step, int64_t total) {
    if (!quiet) {
      char smoothing[48] = "";
      if (settings.label_smoothing > 0)
        std::snprintf(smoothing, sizeof(smoothing), ", label smoothing %g", settings.label_smoothing);
      std::fprintf(stderr,
                   "train %s with %s on %d device%s (%s..%s, %d thread%s each): %lld samples, batch %lld = "
                   "micro-batch %lld x %lld accumulation x %d %s, %s lr %g%s, steps %lld -> %lld\n",
                   settings.model.c_str(), settings.strategy.c_str(), static_cast<int>(settings.devices),
                   settings.devices == 1 ? "" : "s", device_names.front().c_str(), device_names.back().c_str(),
                   plan.threads_per_device, plan.threads_per_device == 1 ? "" : "s",
                   static_cast<long long>(task.train->size()), static_cast<long long>(settings.batch_size),
                   static_cast<long long>(settings.micro_batch), static_cast<long long>(plan.accumulation),
                   plan.replicas, settings.strategy == "mesh" ? "replicas" : "devices", settings.optimizer.c_str(),
                   settings.lr, smoothing, static_cast<long long>(first_step), static_cast<long long>(total));
    }
    for (const Device& d : allocators) reset_peak_memory_stats(d);
  };
  trainer.on_step = [&](int64_t step, const Batch&, const parallel::StepResult& result) {
    report.add_step(result.devices, step);
    skipped_steps += result.skipped;
  };
  trainer.on_metrics = [&](nlohmann::json& line, const parallel::StepResult& result) {
    line["devices"] = DeviceReport::step_json(result.devices);
    line["memory"] = memory_json(local_names, allocators);
  };
  // Training's peaks, before checkpointing and evaluation allocate their own.
  trainer.on_trained = [&] {
    for (size_t d = 0; d < allocators.size(); ++d)
      local_totals.push_back({report.totals().at(d), memory_stats(allocators[d]).peak_allocated_bytes});
  };
  const train::TrainSummary trained = fit(trainer, settings);

  const std::vector<DeviceTotals> totals = strategy->gather(local_totals);
  if (plan.leader && !quiet) {
    std::fputs(DeviceReport::table(device_names, totals, report.steps()).c_str(), stderr);
    std::fputs(strategy->layout_report(totals).c_str(), stderr);
  }
  // No rank leaves before rank 0 has written the checkpoint, nor before every rank's trace
  // is on disk for rank 0 to merge.
  report.close_trace();
  strategy->barrier();
  if (plan.leader) report.merge_rank_traces();
  if (!trained.finished) {
    // Stopped early (--stop-after or a signal): the checkpoint is the result.
    if (plan.leader) {
      std::fprintf(stderr,
                   "lockstep train: stopped after step %lld of %lld%s%s; checkpoint %s\n"
                   "continue with: lockstep train --resume %s\n",
                   static_cast<long long>(trained.steps), static_cast<long long>(total_steps),
                   trained.stop_signal ? " by " : "",
                   trained.stop_signal ? train::stop_signal_name(trained.stop_signal) : "", trained.checkpoint.c_str(),
                   plan.out_dir.c_str());
    }
    return trained.stop_signal ? 128 + trained.stop_signal : 0;
  }
  if (!plan.leader) return 0;

  nn::Module& model = trainer.trained_model();
  const Evaluation test = evaluate(model, *task.test, task.input, task.target);
  const std::string sample = task.language_model ? sample_text(model, settings) : "";
  nlohmann::json summary = {
      {"model", settings.model},
      {"strategy", settings.strategy},
      {"devices", DeviceReport::json(device_names, totals)},
      {"threads_per_device", plan.threads_per_device},
      {"seed", settings.seed},
      {"batch_size", settings.batch_size},
      {"accumulation_steps", plan.accumulation},
      {"optimizer", settings.optimizer},
      {"lr", settings.lr},
      {"label_smoothing", settings.label_smoothing},
      {"precision", settings.precision},
      {"grad_dtype", settings.grad_dtype},
      {"sync_every", settings.sync_every},
      {"powersgd_rank", settings.powersgd_rank},
      {"steps", trained.steps},
      {"skipped_steps", skipped_steps},
      {"epoch", trained.position.epoch},
      {"train_samples", trained.samples},
      {"train_seconds", trained.seconds},
      {"samples_per_second", trained.samples_per_second},
      {task.test_name + "_accuracy", test.accuracy},
      {task.test_name + "_loss", test.loss},
      {"peak_memory_bytes", totals.front().peak_bytes},
      {"optimizer_state_bytes", strategy->optimizer_state_bytes()},
      {"optimizer_offload", plan.offload_optimizer},
      {"peak_rss_bytes", peak_rss_bytes()},
      {"checkpoints", trained.checkpoints},
      {"checkpoint_hold_seconds", trained.checkpoint_hold_seconds},
      {"checkpoint_write_seconds", trained.checkpoint_write_seconds},
      {"weights_sha256", trained.weights_sha256},
  };
  train::add_micro_batch(summary, trained);
  if (task.language_model) {
    summary["gpt"] = {{"layers", task.gpt.layers},
                      {"heads", task.gpt.heads},
                      {"width", task.gpt.width},
                      {"context", task.gpt.context},
                      {"parameters", model.num_parameters()}};
    summary["sample"] = sample;
  }
  if (const nlohmann::json layout = strategy->layout_json(totals); !layout.is_null()) summary["mesh"] = layout;
  if (const nlohmann::json collectives = strategy->collectives_json(); !collectives.is_null()) {
    summary["collectives"] = collectives;
  }
  write_json_file((fs::path(plan.out_dir) / "summary.json").string(), summary);
  if (task.language_model) {
    std::printf("validation loss %.4f  next-byte accuracy %.4f", test.loss, test.accuracy);
  } else {
    std::printf("test accuracy %.4f  test loss %.4f", test.accuracy, test.loss);
  }
  std::printf("  (%lld steps, %.0f samples/s)  -> %s\n", static_cast<long long>(trained.steps),
              trained.samples_per_second, plan.out_dir.c_str());
  if (!sample.empty()) std::printf("sample:\n%s\n", sample.c_str());
  return 0;
}

}  // namespace

int train_main(const std::vector<std::string>& args) {
  // Slurm's --signal can come up to a minute early, as the job starts: caught from the first
  // instant, it stops the run at its first step boundary with a checkpoint instead of ending
  // the process while it meets its peers or loads its data.
  const train::StopSignals stop_signals;
  TrainOptions options;
  Flags flags(
      "lockstep train",
      "Trains a model on Fashion-MNIST (cnn, mlp, resnet) and prints its test accuracy, or a GPT on byte-level\n"
      "text (gpt) and prints its validation loss and a sample. Writes metrics.jsonl,\n"
      "checkpoint.safetensors and summary.json under --out.");
  flags.add("model", &options.model, "cnn, mlp or resnet (Fashion-MNIST), gpt (text)");
  flags.add("preset", &options.preset, "gpt's shape: tiny, small or gpt2-124m");
  flags.add("layers", &options.layers, "gpt: transformer blocks (default: the preset's)");
  flags.add("heads", &options.heads, "gpt: attention heads (default: the preset's)");
  flags.add("width", &options.width, "gpt: embedding width (default: the preset's)");
  flags.add("context", &options.context, "gpt: tokens (bytes) per window (default: the preset's)");
  flags.add_switch("checkpoint-activations", &options.checkpoint_activations,
                   "gpt: recompute each block in backward instead of keeping its activations (less memory, same bits)");
  flags.add("sample", &options.sample_bytes, "gpt: bytes to generate after training (0: none)");
  flags.add("temperature", &options.temperature, "gpt: sampling temperature of the sample (0: greedy)");
  flags.add("epochs", &options.epochs, "passes over the training set");
  flags.add("steps", &options.steps, "optimizer steps to take (default: --epochs worth; 0: only evaluate)");
  flags.add("batch-size", &options.batch_size, "samples per step, over all devices");
  bool auto_micro_batch = false;
  flags.add("micro-batch", &options.micro_batch, "auto", &auto_micro_batch,
            "samples per forward/backward pass (default: batch-size / 8 where it divides); with the seed and batch "
            "size it fixes the result. auto: the largest that lockstep plan predicts to fit, halved when a step "
            "still runs out of memory (dp, ddp, zero1, zero2)");
  flags.add("devices", &options.devices_flag,
            "devices to train on: a count, cpu, cuda, or cuda:0,cuda:1 (default: every GPU, else one CPU device "
            "per core; ddp: the process's own)");
  flags.add("precision", &options.precision,
            "GPUs: f32, or bf16 / f16 matrix products with f32 weights (f16 with a dynamic loss scale)");
  flags.add(
      "strategy", &options.strategy,
      "dp: this process drives every device; ddp: one process per device, started by mpirun, torchrun or "
      "lockstep run; zero1: ddp with the optimizer state sharded across the processes (with --dp, --tp, --pp: the "
      "mesh's, across each data-parallel group); zero2: the reduced gradients sharded too; zero3: the weights too, "
      "each layer gathered when used; mesh "
      "(implied by --dp, "
      "--tp, --pp): a GPT over dp x tp x pp devices driven by this process");
  flags.add("dp", &options.dp, "gpt: data-parallel replicas of the mesh (default: --devices / (tp x pp), else 1)");
  flags.add("tp", &options.tp,
            "gpt: tensor-parallel ranks per replica, each holding 1/T of every block and the vocabulary");
  flags.add("pp", &options.pp, "gpt: pipeline stages per replica, each holding consecutive blocks");
  flags.add("schedule", &options.schedule, "pipeline schedule: 1f1b (at most P micro-batches of activations) or gpipe");
  flags.add("stages", &options.stages, "blocks per pipeline stage, e.g. 3,1 (default: balanced by parameters)");
  flags.add("backend", &options.backend, "ddp's collectives: auto, shm (one host) or mpi");
  flags.add("bucket-mb", &options.bucket_mb, "ddp: MiB of gradients per all-reduce, started during backward");
  flags.add("grad-dtype", &options.grad_dtype,
            "ddp: f32, or bf16: gradients cross between processes in half the bytes, every partial sum rounded to "
            "bf16 (the same bits on any process count; not f32's)");
  flags.add("sync-every", &options.sync_every,
            "ddp: local SGD: each process steps on its own share, and the processes' weights and optimizer state are "
            "averaged every this many steps (1: every step's gradients are all-reduced)");
  flags.add("powersgd-rank", &options.powersgd_rank,
            "ddp: PowerSGD: gradient matrices cross as rank-R approximations with error feedback (0: off)");
  flags.add("powersgd-start", &options.powersgd_start, "ddp: the step PowerSGD starts at; plain all-reduces before");
  flags.add("lr", &options.lr, "learning rate (default: adamw 0.004, resnet 0.006, gpt 0.001; sgd 0.05)");
  flags.add("optimizer", &options.optimizer, "adamw or sgd (default adamw)");
  flags.add_switch("offload-optimizer", &options.offload_optimizer,
                   "GPUs: keep the optimizer state in host memory and step it with the CPU (8 bytes per parameter "
                   "off each GPU for adamw, 12 crossing the bus per step; the same bits). dp, ddp, zero1-3");
  flags.add("momentum", &options.momentum, "SGD momentum");
  flags.add("weight-decay", &options.weight_decay, "weight decay");
  flags.add("label-smoothing", &options.label_smoothing,
            "Fashion-MNIST models: the target is 1-X on the class and X/10 on every class, as PyTorch's "
            "label_smoothing (default 0)");
  flags.add("lr-schedule", &options.lr_schedule,
            "constant | step:N[:GAMMA] | cosine[:warmup=N][:total=N][:min_lr=X] (default: cosine over the run after "
            "100 warm-up steps, or a tenth of a shorter run; gpt: no warm-up)");
  flags.add("seed", &options.seed, "seed of initialization, data order and dropout");
  flags.add("threads", &options.threads, "compute threads in all, shared by the devices (default: every core)");
  flags.add("data", &options.data_dir,
            std::string("Fashion-MNIST folder (default ") + kFashionMnistDefaultDir + "); gpt: a text file (default " +
                "the fortunes under " + kFortunesDefaultDir + ")");
  flags.add("out", &options.out_dir, "output folder (default runs/<timestamp>, or the --resume folder)");
  flags.add("resume", &options.resume_dir,
            "continue the run in this folder from its newest intact checkpoint, with its recipe; auto: --out's, or a "
            "fresh start when it has none (one command line for the first start and every restart)");
  flags.add("checkpoint-every", &options.checkpoint_every,
            "steps between checkpoints while training, written in the background (0: only at the end)");
  flags.add("checkpoint-interval", &options.checkpoint_interval,
            "time between checkpoints while training: 90s, 10m, 1h (default: none)");
  flags.add("keep-checkpoints", &options.keep_checkpoints, "how many of the newest checkpoints stay under --out");
  flags.add("stop-after", &options.stop_after,
            "stop after this step with a checkpoint, the recipe unchanged: --resume then ends as one run would");
  flags.add("init", &options.init_file, "start from these weights (.safetensors, PyTorch names)");
  flags.add("log-every", &options.log_every, "steps between metrics.jsonl lines");
  flags.add("trace", &options.trace_file, "write each device's steps as a Chrome trace (opens in Perfetto)");
  flags.add_switch("quiet", &options.quiet, "no progress display");
  if (!flags.parse(args)) return 0;
  options.micro_batch_auto = auto_micro_batch;
  const TrainEnvironment environment = environment_of(options);
  // auto: plan with the default first, for the layout; a checkpoint's micro-batch stays.
  const auto given = [&](const std::string& flag) {
    return flags.given(flag) && !(auto_micro_batch && flag == "micro-batch");
  };
  TrainPlan plan = plan_training(options, given, environment);
  if (auto_micro_batch && !environment.checkpoint) {
    const MicroBatchChoice choice = choose_micro_batch_here(plan, environment);
    options.micro_batch = choice.micro_batch;
    plan = plan_training(options, given, environment);
    if (plan.leader) std::printf("%s\n", describe(choice).c_str());
  }
  return run_training(plan);
}

}  // namespace lockstep::tools
