#include "lockstep/train/trainer.h"

#include <array>
#include <chrono>
#include <filesystem>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/io/checkpoint.h"
#include "lockstep/io/weights_sha256.h"
#include "lockstep/obs/json_lines.h"
#include "lockstep/obs/progress.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/schedule.h"

namespace lockstep::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kModelPrefix = "model.";
constexpr const char* kOptimizerPrefix = "optim.";

// The entries of `tensors` whose name starts with `prefix`, without it.
NamedTensors with_prefix_removed(const NamedTensors& tensors, const std::string& prefix) {
  NamedTensors out;
  for (const auto& [name, tensor] : tensors) {
    if (name.rfind(prefix, 0) == 0) out.emplace_back(name.substr(prefix.size()), tensor);
  }
  return out;
}

// The keys the trainer keeps in a checkpoint's metadata; a recipe may not reuse them.
constexpr std::array<const char*, 5> kTrainerKeys = {"step", "epoch", "sample", "seed", "batch_size"};

int64_t metadata_integer(const Checkpoint& checkpoint, const std::string& key, const std::string& path) {
  const auto it = checkpoint.metadata.find(key);
  LOCKSTEP_CHECK(it != checkpoint.metadata.end()) << path << " has no '" << key << "' in its metadata: it is not a "
                                                  << "checkpoint of a Trainer";
  const std::string& text = it->second;
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  LOCKSTEP_CHECK(used > 0 && used == text.size() && value >= 0)
      << path << ": metadata '" << key << "' should be a whole number, got '" << text << "'";
  return value;
}

}  // namespace

Trainer::Trainer(parallel::Layout& layout, std::shared_ptr<const Dataset> train_set, TrainerOptions options)
    : layout_(layout), train_set_(std::move(train_set)), options_(std::move(options)) {
  LOCKSTEP_CHECK(train_set_ != nullptr) << "Trainer: no training set given";
  LOCKSTEP_CHECK(options_.batch_size >= 1) << "Trainer: the batch size must be at least 1, got " << options_.batch_size;
  LOCKSTEP_CHECK(options_.epochs >= 0 && options_.steps >= -1)
      << "Trainer: epochs (" << options_.epochs << ") and steps (" << options_.steps << ") must not be negative";
  LOCKSTEP_CHECK(options_.log_every >= 1) << "Trainer: log_every must be at least 1, got " << options_.log_every;
  for (const char* key : kTrainerKeys) {
    LOCKSTEP_CHECK(!options_.recipe.contains(key))
        << "Trainer: the recipe may not set '" << key << "': the trainer keeps it in the checkpoint itself";
  }
}

TrainSummary Trainer::fit() {
  // A short last batch is dropped: it would make a step whose tree depends on how it is cut.
  DataLoader loader(train_set_,
                    {.batch_size = options_.batch_size, .shuffle = true, .seed = options_.seed, .drop_last = true});
  LOCKSTEP_CHECK(loader.batches_per_epoch() > 0)
      << "Trainer: a batch of " << options_.batch_size << " samples is larger than the training set ("
      << train_set_->size() << " samples)";
  const int64_t total = options_.steps >= 0 ? options_.steps : options_.epochs * loader.batches_per_epoch();
  const optim::Schedule parsed = optim::parse_schedule(options_.lr_schedule);
  const optim::Schedule schedule = total > 0 ? parsed.with_total_steps(total) : parsed;

  TrainSummary summary;
  const fs::path out = options_.out_dir;
  const std::string checkpoint_path = out.empty() ? "" : (out / kCheckpointFile).string();
  std::string resume_path;
  if (options_.resume == "auto") {
    if (!checkpoint_path.empty() && fs::exists(checkpoint_path)) resume_path = checkpoint_path;
  } else if (options_.resume != "none") {
    resume_path = options_.resume;
  }
  if (!resume_path.empty()) {
    const Checkpoint checkpoint = load_checkpoint(resume_path);
    for (const auto& [key, ours] : {std::pair<std::string, int64_t>{"batch_size", options_.batch_size},
                                    {"seed", static_cast<int64_t>(options_.seed)}}) {
      const int64_t theirs = metadata_integer(checkpoint, key, resume_path);
      LOCKSTEP_CHECK(theirs == ours) << resume_path << " was made with " << key << " " << theirs << ", this run has "
                                     << ours << ": resume with the same " << key << ", or give another out_dir";
    }
    try {
      layout_.load_model_state(with_prefix_removed(checkpoint.tensors, kModelPrefix));
      layout_.load_optimizer_state(with_prefix_removed(checkpoint.tensors, kOptimizerPrefix));
    } catch (const Error& e) {
      LOCKSTEP_FAIL() << resume_path << " does not fit this model: " << e.what();
    }
    summary.resumed_from = metadata_integer(checkpoint, "step", resume_path);
    loader.set_position(
        {metadata_integer(checkpoint, "epoch", resume_path), metadata_integer(checkpoint, "sample", resume_path)});
  }
  std::unique_ptr<JsonLinesWriter> metrics;
  if (options_.leader && !out.empty()) {
    fs::create_directories(out);
    metrics = std::make_unique<JsonLinesWriter>((out / "metrics.jsonl").string(), summary.resumed_from > 0);
  }

  if (on_start) on_start(summary.resumed_from, total);
  ProgressBar progress(total, !(options_.progress && options_.leader));
  const auto start = std::chrono::steady_clock::now();
  int64_t step = summary.resumed_from;
  while (step < total) {
    const std::optional<Batch> batch = loader.next();
    if (!batch) continue;  // the epoch is over; the loader moved to the next one
    layout_.set_lr(schedule.lr_at(options_.lr, step));
    const parallel::StepResult result = layout_.step(
        batch->samples,
        {.seed = options_.seed, .step = static_cast<uint64_t>(step), .first_sample = batch->first_position});
    ++step;
    summary.samples += batch->size();
    summary.loss = result.loss;
    summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    summary.samples_per_second = summary.seconds > 0 ? static_cast<double>(summary.samples) / summary.seconds : 0.0;
    progress.update(step, batch->epoch, result.loss, summary.samples_per_second);
    if (metrics && (step % options_.log_every == 0 || step == total)) {
      nlohmann::json line = {{"step", step},
                             {"epoch", batch->epoch},
                             {"loss", result.loss},
                             {"lr", layout_.lr()},
                             {"samples_per_second", summary.samples_per_second}};
      if (on_metrics) on_metrics(line, result);
      metrics->write(line);
    }
    if (on_step) on_step(step, *batch, result);
  }
  progress.finish();
  summary.steps = step;
  summary.position = loader.position();
  if (on_trained) on_trained();

  // Collective under sharded layouts: every process gathers, the leader writes.
  const NamedTensors optimizer_state = layout_.optimizer_state();
  nn::Module& model = layout_.model();
  trained_ = &model;
  summary.weights_sha256 = weights_sha256(model);
  if (options_.leader && !out.empty()) {
    NamedTensors tensors;
    for (const auto& [name, tensor] : model.state_dict()) tensors.emplace_back(kModelPrefix + name, tensor);
    for (const auto& [name, tensor] : optimizer_state) tensors.emplace_back(kOptimizerPrefix + name, tensor);
    Metadata metadata = options_.recipe;
    metadata["step"] = std::to_string(step);
    metadata["epoch"] = std::to_string(summary.position.epoch);
    metadata["sample"] = std::to_string(summary.position.sample);
    metadata["seed"] = std::to_string(options_.seed);
    metadata["batch_size"] = std::to_string(options_.batch_size);
    save_checkpoint(checkpoint_path, tensors, metadata);
  }
  if (options_.leader && !out.empty() && options_.write_summary) {
    write_json_file((out / "summary.json").string(), {{"steps", summary.steps},
                                                      {"resumed_from", summary.resumed_from},
                                                      {"loss", summary.loss},
                                                      {"train_seconds", summary.seconds},
                                                      {"samples_per_second", summary.samples_per_second},
                                                      {"batch_size", options_.batch_size},
                                                      {"seed", options_.seed},
                                                      {"weights_sha256", summary.weights_sha256}});
  }
  return summary;
}

nn::Module& Trainer::trained_model() const {
  LOCKSTEP_CHECK(trained_ != nullptr) << "Trainer::trained_model: fit() has not run";
  return *trained_;
}

double evaluate_loss(nn::Module& model, const Dataset& data, const parallel::LossFunction& loss, int64_t batch) {
  LOCKSTEP_CHECK(batch >= 1) << "evaluate_loss: the batch must hold at least one sample, got " << batch;
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const std::vector<Tensor> parameters = model.parameters();
  const Device device = parameters.empty() ? Device::cpu() : parameters.front().device();
  double total = 0;
  int64_t terms = 0;
  for (int64_t first = 0; first < data.size(); first += batch) {
    const int64_t count = std::min(batch, data.size() - first);
    const Tensor losses = loss(model, data.range(first, count).to(device), {.first_sample = first});
    LOCKSTEP_CHECK(losses.dim() >= 1 && losses.size(0) == count)
        << "evaluate_loss: the loss function returned " << shape_str(losses.shape()) << " for " << count
        << " samples: return one loss per sample";
    total += sum(losses.to(DType::f64)).item();
    terms += losses.numel();
  }
  model.train(was_training);
  return terms > 0 ? total / static_cast<double>(terms) : 0.0;
}

}  // namespace lockstep::train
