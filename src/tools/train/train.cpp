// `lockstep train`: trains a built-in model on every local device — a classifier on
// Fashion-MNIST, or a GPT on byte-level text (train_task.h) — with progress on stderr,
// metrics.jsonl / checkpoint.safetensors / summary.json under --out, the per-device time
// table on stderr, and the test accuracy (the GPT: validation loss and a sample) on stdout. Every run, one
// device or many, takes the same tree-shaped step (parallel/data_parallel.h), so
// `weights_sha256` depends on (seed, batch, micro-batch) and not on the device count.
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "lockstep/core/allocator.h"
#include "lockstep/core/cuda_device.h"
#include "lockstep/core/parallel.h"
#include "lockstep/data/dataloader.h"
#include "lockstep/data/fashion_mnist.h"
#include "lockstep/data/text_dataset.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/io/weights_sha256.h"
#include "lockstep/nn/models.h"
#include "lockstep/obs/json_lines.h"
#include "lockstep/obs/progress.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/optim/schedule.h"
#include "lockstep/optim/sgd.h"
#include "tools/common/commands.h"
#include "tools/common/flags.h"
#include "tools/common/run_dir.h"
#include "tools/train/device_report.h"
#include "tools/train/printable_text.h"
#include "tools/train/train_checkpoint.h"
#include "tools/train/train_devices.h"
#include "tools/train/train_strategy.h"
#include "tools/train/train_task.h"

namespace lockstep::tools {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

// Mean loss and accuracy over every prediction: one per image, or one per position of a
// text window (next-byte accuracy).
Evaluation evaluate(nn::Module& model, const TensorDataset& data, const std::string& input_field,
                    const std::string& target_field) {
  NoGradGuard no_grad;
  model.eval();
  const Tensor& inputs = data[input_field];
  const Tensor& targets = data[target_field];
  const int64_t n = data.size();
  const int64_t per_sample = n > 0 ? targets.numel() / n : 1;
  const int64_t batch = std::max<int64_t>(1, 1000 / per_sample);  // about a thousand predictions at a time
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
  model.train();
  const double total = static_cast<double>(n * per_sample);
  return {n ? loss_sum / total : 0.0, n ? static_cast<double>(correct) / total : 0.0};
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

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& options, std::vector<Tensor> params) {
  if (options.optimizer == "sgd") {
    return std::make_unique<optim::SGD>(
        std::move(params),
        optim::SGDOptions{.lr = options.lr, .momentum = options.momentum, .weight_decay = options.weight_decay});
  }
  if (options.optimizer == "adamw") {
    return std::make_unique<optim::AdamW>(std::move(params),
                                          optim::AdamWOptions{.lr = options.lr, .weight_decay = options.weight_decay});
  }
  throw UsageError("--optimizer must be sgd or adamw, got '" + options.optimizer + "'");
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

// Flag values out of range are usage errors (exit 2), as a flag that does not parse is.
void check_options(const TrainOptions& options) {
  const auto require = [](bool ok, const std::string& message) {
    if (!ok) throw UsageError(message);
  };
  require(options.batch_size > 0, "--batch-size must be at least 1, got " + std::to_string(options.batch_size));
  require(options.micro_batch > 0, "--micro-batch must be at least 1, got " + std::to_string(options.micro_batch));
  require(options.bucket_mb > 0, "--bucket-mb must be positive, got " + flag_number(options.bucket_mb));
  require(options.epochs >= 0, "--epochs must be 0 or more, got " + std::to_string(options.epochs));
  require(options.steps >= -1, "--steps must be 0 or more, got " + std::to_string(options.steps));
  require(options.lr > 0 && std::isfinite(options.lr),
          "--lr must be a positive number, got " + flag_number(options.lr));
  require(options.threads >= 0, "--threads must be 1 or more, got " + std::to_string(options.threads));
  require(options.log_every > 0, "--log-every must be at least 1, got " + std::to_string(options.log_every));
  if (!options.lr_schedule.empty()) {
    // A given schedule is checked now; the default one depends on the run's length.
    try {
      optim::parse_schedule(options.lr_schedule);
    } catch (const Error& e) {
      throw UsageError(std::string("--lr-schedule: ") + e.what());
    }
  }
}

}  // namespace

int train_main(const std::vector<std::string>& args) {
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
  flags.add("micro-batch", &options.micro_batch,
            "samples per forward/backward pass (default: batch-size / 8 where it divides); with the seed and batch "
            "size it fixes the result");
  flags.add("devices", &options.devices_flag,
            "devices to train on: a count, cpu, cuda, or cuda:0,cuda:1 (default: every GPU, else one CPU device "
            "per core; ddp: the process's own)");
  flags.add("precision", &options.precision,
            "GPUs: f32, or bf16 / f16 matrix products with f32 weights (f16 with a dynamic loss scale)");
  flags.add("strategy", &options.strategy,
            "dp: this process drives every device; ddp: one process per device, started by mpirun, torchrun or "
            "lockstep run; zero1: ddp with the optimizer state sharded across the processes; mesh (implied by --dp, "
            "--tp, --pp): a GPT over dp x tp x pp devices driven by this process");
  flags.add("dp", &options.dp, "gpt: data-parallel replicas of the mesh (default: --devices / (tp x pp), else 1)");
  flags.add("tp", &options.tp,
            "gpt: tensor-parallel ranks per replica, each holding 1/T of every block and the vocabulary");
  flags.add("pp", &options.pp, "gpt: pipeline stages per replica, each holding consecutive blocks");
  flags.add("schedule", &options.schedule, "pipeline schedule: 1f1b (at most P micro-batches of activations) or gpipe");
  flags.add("stages", &options.stages, "blocks per pipeline stage, e.g. 3,1 (default: balanced by parameters)");
  flags.add("backend", &options.backend, "ddp's collectives: auto, shm (one host) or mpi");
  flags.add("bucket-mb", &options.bucket_mb, "ddp: MiB of gradients per all-reduce, started during backward");
  flags.add("lr", &options.lr, "learning rate (default: adamw 0.004, gpt 0.001; sgd 0.05)");
  flags.add("optimizer", &options.optimizer, "adamw or sgd (default adamw)");
  flags.add("momentum", &options.momentum, "SGD momentum");
  flags.add("weight-decay", &options.weight_decay, "weight decay");
  flags.add("lr-schedule", &options.lr_schedule,
            "constant | step:N[:GAMMA] | cosine[:warmup=N][:total=N][:min_lr=X] (default: cosine over the run after "
            "100 warm-up steps, or a tenth of a shorter run; gpt: no warm-up)");
  flags.add("seed", &options.seed, "seed of initialization, data order and dropout");
  flags.add("threads", &options.threads, "compute threads in all, shared by the devices (default: every core)");
  flags.add("data", &options.data_dir,
            std::string("Fashion-MNIST folder (default ") + kFashionMnistDefaultDir + "); gpt: a text file (default " +
                "the fortunes under " + kFortunesDefaultDir + ")");
  flags.add("out", &options.out_dir, "output folder (default runs/<timestamp>, or the --resume folder)");
  flags.add("resume", &options.resume_dir, "continue the run whose checkpoint is in this folder");
  flags.add("init", &options.init_file, "start from these weights (.safetensors, PyTorch names)");
  flags.add("log-every", &options.log_every, "steps between metrics.jsonl lines");
  flags.add("trace", &options.trace_file, "write each device's steps as a Chrome trace (opens in Perfetto)");
  flags.add_switch("quiet", &options.quiet, "no progress display");
  if (!flags.parse(args)) return 0;

  std::optional<Checkpoint> checkpoint;
  std::string checkpoint_path;
  if (!options.resume_dir.empty()) {
    checkpoint_path = (fs::path(options.resume_dir) / kCheckpointFile).string();
    LOCKSTEP_CHECK(fs::exists(checkpoint_path))
        << "--resume " << options.resume_dir << ": no " << kCheckpointFile << " in that folder";
    checkpoint = load_checkpoint(checkpoint_path);
    apply_checkpoint_settings(*checkpoint, checkpoint_path, options,
                              [&](const std::string& flag) { return flags.given(flag); });
  }
  if (flags.given("dp") || flags.given("tp") || flags.given("pp") || flags.given("schedule") || flags.given("stages")) {
    if (flags.given("strategy") && options.strategy != "mesh") {
      throw UsageError("--dp, --tp, --pp, --schedule and --stages lay out a mesh; they do not go with --strategy " +
                       options.strategy);
    }
    options.strategy = "mesh";
  }
  // The GPT and the mesh layouts run on CPU devices in this version: only an explicit
  // request for GPUs is an error for them.
  const bool cpu_only = options.model == "gpt" || options.strategy == "mesh";
  if (cpu_only && (options.devices_flag.find("cuda") != std::string::npos || options.devices_flag == "gpu")) {
    throw UsageError("--devices " + options.devices_flag +
                     ": --model gpt and the mesh layouts (--dp, --tp, --pp) run on CPU devices in this version; give "
                     "a count or cpu");
  }
  const DeviceChoice choice = parse_devices(options.devices_flag, cpu_only ? 0 : cuda::device_count());
  options.devices = choice.count;
  options.device_type = choice.type;
  if (options.precision != "f32" && options.precision != "bf16" && options.precision != "f16") {
    throw UsageError("--precision must be f32, bf16 or f16, got '" + options.precision + "'");
  }
  if (options.precision != "f32" && options.device_type != DeviceType::cuda) {
    throw UsageError("--precision " + options.precision +
                     " runs on GPU devices; CPU devices compute in f32 (leave --precision out)");
  }
  // After the checkpoint's settings: a resumed run keeps the optimizer it had.
  if (options.optimizer.empty()) options.optimizer = kDefaultOptimizer;
  // -1 stands for "the optimizer's default": a negative --lr must not pass for it.
  if (flags.given("lr") && !(options.lr > 0)) {
    throw UsageError("--lr must be a positive number, got " + flag_number(options.lr));
  }
  if (options.lr < 0) options.lr = default_lr(options.model, options.optimizer);
  if (options.micro_batch < 0) options.micro_batch = default_micro_batch(options.batch_size);
  check_options(options);

  const TrainTask task = make_train_task(options);
  if (task.language_model) {
    // The resolved shape, for the checkpoint (a resume needs no shape flags).
    options.layers = task.gpt.layers;
    options.heads = task.gpt.heads;
    options.width = task.gpt.width;
    options.context = task.gpt.context;
  }
  const TensorDataset& train_set = *task.train;

  const std::optional<TensorFile> init =
      options.init_file.empty() ? std::nullopt : std::optional<TensorFile>(load_safetensors(options.init_file));
  const std::unique_ptr<TrainStrategy> strategy = make_train_strategy(
      options, task.loss,
      [&] {
        std::shared_ptr<nn::Module> replica = task.make_model();
        if (init) {
          try {
            replica->load_state_dict(init->tensors);
          } catch (const Error& e) {
            LOCKSTEP_FAIL() << "--init " << options.init_file << " does not fit model '" << options.model
                            << "': " << e.what();
          }
        }
        return replica;
      },
      [&](std::vector<Tensor> params) { return make_optimizer(options, std::move(params)); });
  const int devices = static_cast<int>(options.devices);
  const bool leader = strategy->leader();
  const bool quiet = options.quiet || !leader;
  set_num_threads(strategy->process_threads());  // evaluation runs on this thread

  // The last batch of an epoch is dropped when it is short: a partial batch would make a
  // step whose tree depends on how it is cut.
  DataLoader loader(task.train,
                    {.batch_size = options.batch_size, .shuffle = true, .seed = options.seed, .drop_last = true});
  LOCKSTEP_CHECK(loader.batches_per_epoch() > 0)
      << "--batch-size " << options.batch_size << " is larger than the training set (" << train_set.size()
      << " samples)";
  RunPosition position;
  if (checkpoint) {
    position = strategy->restore(*checkpoint, checkpoint_path);
    loader.set_position(position.data);
    checkpoint.reset();
  }
  const int64_t total_steps = options.steps >= 0 ? options.steps : options.epochs * loader.batches_per_epoch();
  if (options.lr_schedule.empty()) options.lr_schedule = default_lr_schedule(options.model, total_steps);
  const optim::Schedule schedule = optim::parse_schedule(options.lr_schedule);
  // A schedule without an explicit length spans this run; --steps 0 takes no step to span.
  const optim::Schedule lr_schedule = total_steps > 0 ? schedule.with_total_steps(total_steps) : schedule;

  const std::string out_dir = !options.out_dir.empty()      ? options.out_dir
                              : !options.resume_dir.empty() ? options.resume_dir
                                                            : fresh_run_dir();
  std::optional<JsonLinesWriter> metrics;
  if (leader) {
    fs::create_directories(out_dir);
    metrics.emplace((fs::path(out_dir) / "metrics.jsonl").string());
  }

  const std::vector<std::string> device_names = strategy->all_devices();
  DeviceReport report(strategy->local_devices(), leader ? options.trace_file : "");
  // The devices that share the batch: every device, or a mesh's data-parallel replicas.
  const int replicas = options.strategy == "mesh" ? static_cast<int>(options.dp) : devices;
  const int64_t accumulation = options.batch_size / options.micro_batch / replicas;
  const int threads_per_device = strategy->threads_per_device();
  if (!quiet) {
    std::fprintf(stderr,
                 "train %s with %s on %d device%s (%s..%s, %d thread%s each): %lld samples, batch %lld = micro-batch "
                 "%lld x %lld accumulation x %d %s, %s lr %g, steps %lld -> %lld\n",
                 options.model.c_str(), options.strategy.c_str(), devices, devices == 1 ? "" : "s",
                 device_names.front().c_str(), device_names.back().c_str(), threads_per_device,
                 threads_per_device == 1 ? "" : "s", static_cast<long long>(train_set.size()),
                 static_cast<long long>(options.batch_size), static_cast<long long>(options.micro_batch),
                 static_cast<long long>(accumulation), replicas, options.strategy == "mesh" ? "replicas" : "devices",
                 options.optimizer.c_str(), options.lr, static_cast<long long>(position.step),
                 static_cast<long long>(total_steps));
  }
  ProgressBar progress(total_steps, quiet);
  const std::vector<Device> allocators = strategy->local_allocators();
  const std::vector<std::string> local_names = strategy->local_devices();
  for (const Device& d : allocators) reset_peak_memory_stats(d);
  const auto start = Clock::now();
  int64_t samples = 0, skipped_steps = 0;
  double last_loss = NAN;
  while (position.step < total_steps) {
    const std::optional<Batch> batch = loader.next();
    if (!batch) continue;  // epoch finished; the loader moved to the next one
    strategy->set_lr(lr_schedule.lr_at(options.lr, position.step));
    const parallel::StepResult step = strategy->step(*batch, static_cast<uint64_t>(position.step), options.seed);
    report.add_step(step.devices);
    skipped_steps += step.skipped;
    ++position.step;
    samples += batch->size();
    last_loss = step.loss;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const double rate = elapsed > 0 ? static_cast<double>(samples) / elapsed : 0.0;
    progress.update(position.step, batch->epoch, last_loss, rate);
    if (metrics && (position.step % options.log_every == 0 || position.step == total_steps)) {
      metrics->write({{"step", position.step},
                      {"epoch", batch->epoch},
                      {"loss", last_loss},
                      {"lr", strategy->lr()},
                      {"samples_per_second", rate},
                      {"devices", DeviceReport::step_json(step.devices)},
                      {"memory", memory_json(local_names, allocators)}});
    }
  }
  const double train_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // Training's peaks, before checkpointing and evaluation allocate their own.
  std::vector<DeviceTotals> local_totals;
  for (size_t d = 0; d < allocators.size(); ++d)
    local_totals.push_back({report.totals().at(d), memory_stats(allocators[d]).peak_allocated_bytes});
  progress.finish();
  position.data = loader.position();
  const std::vector<DeviceTotals> totals = strategy->gather(local_totals);
  const NamedTensors optimizer_state = strategy->optimizer_state();  // collective under zero1
  nn::Module& model = strategy->model();                             // a mesh assembles the full model
  if (leader) {
    save_train_checkpoint((fs::path(out_dir) / kCheckpointFile).string(), options, model, optimizer_state, position);
    if (!quiet) {
      std::fputs(DeviceReport::table(device_names, totals, report.steps()).c_str(), stderr);
      std::fputs(strategy->layout_report(totals).c_str(), stderr);
    }
  }
  // No rank leaves before rank 0 has written the checkpoint.
  strategy->barrier();
  if (!leader) return 0;

  const Evaluation test = evaluate(model, *task.test, task.input, task.target);
  const std::string sample = task.language_model ? sample_text(model, options) : "";
  const double rate = train_seconds > 0 ? static_cast<double>(samples) / train_seconds : 0.0;
  const nlohmann::json summary = {
      {"model", options.model},
      {"strategy", options.strategy},
      {"devices", DeviceReport::json(device_names, totals)},
      {"threads_per_device", threads_per_device},
      {"seed", options.seed},
      {"batch_size", options.batch_size},
      {"micro_batch", options.micro_batch},
      {"accumulation_steps", accumulation},
      {"optimizer", options.optimizer},
      {"lr", options.lr},
      {"precision", options.precision},
      {"steps", position.step},
      {"skipped_steps", skipped_steps},
      {"epoch", position.data.epoch},
      {"train_samples", samples},
      {"train_seconds", train_seconds},
      {"samples_per_second", rate},
      {task.test_name + "_accuracy", test.accuracy},
      {task.test_name + "_loss", test.loss},
      {"peak_memory_bytes", totals.front().peak_bytes},
      {"optimizer_state_bytes", strategy->optimizer_state_bytes()},
      {"peak_rss_bytes", peak_rss_bytes()},
      {"weights_sha256", weights_sha256(model)},
  };
  nlohmann::json full_summary = summary;
  if (task.language_model) {
    full_summary["gpt"] = {{"layers", task.gpt.layers},
                           {"heads", task.gpt.heads},
                           {"width", task.gpt.width},
                           {"context", task.gpt.context},
                           {"parameters", model.num_parameters()}};
    full_summary["sample"] = sample;
  }
  if (const nlohmann::json layout = strategy->layout_json(totals); !layout.is_null()) full_summary["mesh"] = layout;
  write_json_file((fs::path(out_dir) / "summary.json").string(), full_summary);
  if (task.language_model) {
    std::printf("validation loss %.4f  next-byte accuracy %.4f  (%lld steps, %.0f samples/s)  -> %s\n", test.loss,
                test.accuracy, static_cast<long long>(position.step), rate, out_dir.c_str());
    if (!sample.empty()) std::printf("sample:\n%s\n", sample.c_str());
  } else {
    std::printf("test accuracy %.4f  test loss %.4f  (%lld steps, %.0f samples/s)  -> %s\n", test.accuracy, test.loss,
                static_cast<long long>(position.step), rate, out_dir.c_str());
  }
  return 0;
}

}  // namespace lockstep::tools
