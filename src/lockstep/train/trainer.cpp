#include "lockstep/train/trainer.h"

#include <array>
#include <chrono>
#include <filesystem>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/comm/flight_recorder.h"
#include "lockstep/io/checkpoint.h"
#include "lockstep/io/weights_sha256.h"
#include "lockstep/obs/json_lines.h"
#include "lockstep/obs/progress.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/schedule.h"
#include "lockstep/train/stop_signals.h"

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
constexpr std::array<const char*, 6> kTrainerKeys = {"step", "epoch", "sample", "seed", "batch_size", "micro_batch"};

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
  LOCKSTEP_CHECK(options_.checkpoint_every >= 0 && options_.checkpoint_interval_seconds >= 0)
      << "Trainer: checkpoint_every (" << options_.checkpoint_every << ") and checkpoint_interval_seconds ("
      << options_.checkpoint_interval_seconds << ") must not be negative";
  LOCKSTEP_CHECK(options_.keep_checkpoints >= 1)
      << "Trainer: keep_checkpoints must be at least 1, got " << options_.keep_checkpoints;
  for (const char* key : kTrainerKeys) {
    LOCKSTEP_CHECK(!options_.recipe.contains(key))
        << "Trainer: the recipe may not set '" << key << "': the trainer keeps it in the checkpoint itself";
  }
}

// The checkpoint `resume` names, loaded: nullopt for a fresh start.
std::optional<FoundCheckpoint> checkpoint_to_resume(const std::string& resume, const std::string& out_dir) {
  if (resume == "none") return std::nullopt;
  if (resume == "auto") {
    if (out_dir.empty() || !fs::is_directory(out_dir)) return std::nullopt;
    return CheckpointFolder::load_newest(out_dir);
  }
  if (fs::is_directory(resume)) {
    std::optional<FoundCheckpoint> found = CheckpointFolder::load_newest(resume);
    LOCKSTEP_CHECK(found) << "resume: no intact checkpoint in " << resume;
    return found;
  }
  return FoundCheckpoint{resume, load_checkpoint(resume)};
}

TrainSummary Trainer::fit() {
  try {
    return run_fit();
  } catch (const std::exception& error) {
    // The other processes learn why at once, not at their collective's timeout.
    layout_.give_up(error.what());
    throw;
  }
}

TrainSummary Trainer::run_fit() {
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
  if (const std::optional<FoundCheckpoint> found = checkpoint_to_resume(options_.resume, options_.out_dir)) {
    const Checkpoint& checkpoint = found->checkpoint;
    const std::string& path = found->path;
    std::vector<std::pair<std::string, int64_t>> kept = {{"batch_size", options_.batch_size},
                                                         {"seed", static_cast<int64_t>(options_.seed)}};
    // The micro-batch shapes the step's tree; checkpoints of programs that kept no
    // micro-batch, or of layouts that do not say theirs, resume as before.
    if (layout_.micro_batch() > 0 && checkpoint.metadata.contains("micro_batch"))
      kept.emplace_back("micro_batch", layout_.micro_batch());
    for (const auto& [key, ours] : kept) {
      const int64_t theirs = metadata_integer(checkpoint, key, path);
      LOCKSTEP_CHECK(theirs == ours) << path << " was made with " << key << " " << theirs << ", this run has " << ours
                                     << ": resume with the same " << key << ", or give another out_dir";
    }
    try {
      layout_.load_model_state(with_prefix_removed(checkpoint.tensors, kModelPrefix));
      layout_.load_optimizer_state(with_prefix_removed(checkpoint.tensors, kOptimizerPrefix));
    } catch (const Error& e) {
      LOCKSTEP_FAIL() << path << " does not fit this model: " << e.what();
    }
    summary.resumed_from = metadata_integer(checkpoint, "step", path);
    loader.set_position({metadata_integer(checkpoint, "epoch", path), metadata_integer(checkpoint, "sample", path)});
  }
  std::unique_ptr<JsonLinesWriter> metrics;
  if (options_.leader && !out.empty()) {
    writer_ = std::make_unique<CheckpointWriter>(CheckpointFolder(options_.out_dir, options_.keep_checkpoints));
    metrics = std::make_unique<JsonLinesWriter>((out / "metrics.jsonl").string(), summary.resumed_from > 0);
  }
  // The program's own, where it installed one before the run (stop_signals.h).
  std::optional<StopSignals> signals;
  if (options_.stop_on_signals && !stop_signals_installed()) signals.emplace();
  // Saving by the clock and stopping on a signal need every process's agreement at each
  // step boundary; saving every N steps and stop_at_step do not.
  const bool agree = options_.stop_on_signals || options_.checkpoint_interval_seconds > 0;
  constexpr int64_t kSignalled = 1000;  // an agreed value of 1000 + signal: stop; 1: save

  if (on_start) on_start(summary.resumed_from, total);
  ProgressBar progress(total, !(options_.progress && options_.leader));
  const auto start = std::chrono::steady_clock::now();
  auto last_save = start;
  int64_t step = summary.resumed_from;
  bool stop = false;
  // A checkpoint or a stop due while the layout's replicas disagree (local SGD between
  // averagings) waits for the next step where they agree: only then is one copy the state.
  bool save_pending = false, stop_pending = false;
  // Where the loop is, for a hang's report (comm/flight_recorder.h): steps numbered as the
  // metrics and checkpoints number them, from 1.
  comm::FlightRecorder& flight = comm::FlightRecorder::process();
  while (step < total && !stop) {
    flight.set_step(step + 1);
    flight.set_phase("loading data");
    const std::optional<Batch> batch = loader.next();
    if (!batch) continue;  // the epoch is over; the loader moved to the next one
    layout_.set_lr(schedule.lr_at(options_.lr, step));
    flight.set_phase("step");
    const parallel::StepResult result =
        step_layout(batch->samples,
                    {.seed = options_.seed, .step = static_cast<uint64_t>(step), .first_sample = batch->first_position},
                    summary, progress);
    flight.set_phase("step boundary");
    ++step;
    summary.samples += batch->size();
    summary.loss = result.loss;
    const auto now = std::chrono::steady_clock::now();
    summary.seconds = std::chrono::duration<double>(now - start).count();
    summary.samples_per_second = summary.seconds > 0 ? static_cast<double>(summary.samples) / summary.seconds : 0.0;
    progress.update(step, batch->epoch, result.loss, summary.samples_per_second);
    if (metrics && (step % options_.log_every == 0 || step == total)) {
      nlohmann::json line = {{"step", step},
                             {"epoch", batch->epoch},
                             {"loss", result.loss},
                             {"lr", layout_.lr()},
                             {"samples_per_second", summary.samples_per_second}};
      if (on_metrics) on_metrics(line, result);
      try {
        metrics->write(line);
      } catch (const Error& e) {
        // A full disk: stop, and say what is kept.
        LOCKSTEP_FAIL() << e.what() << "; the run stops at step " << step
                        << (saved_step_ >= 0 ? ", its checkpoint of step " + std::to_string(saved_step_) + " in " +
                                                   options_.out_dir + " is intact"
                                             : ", before its first checkpoint");
      }
    }
    if (on_step) on_step(step, *batch, result);
    if (step == total) break;  // the end's checkpoint follows

    bool save_now = options_.checkpoint_every > 0 && step % options_.checkpoint_every == 0;
    if (agree) {
      const bool clock_due =
          options_.leader && options_.checkpoint_interval_seconds > 0 &&
          std::chrono::duration<double>(now - last_save).count() >= options_.checkpoint_interval_seconds;
      const int signal = options_.stop_on_signals ? stop_signal_received() : 0;
      const int64_t agreed = layout_.max_over_processes(signal ? kSignalled + signal : clock_due ? 1 : 0);
      if (agreed >= kSignalled) {
        summary.stop_signal = static_cast<int>(agreed - kSignalled);
        stop = true;
      }
      save_now = save_now || agreed == 1;
    }
    if (step == options_.stop_at_step) stop = true;
    if (!layout_.replicas_agree()) {
      save_pending = save_pending || save_now;
      stop_pending = stop_pending || stop;
      save_now = stop = false;
    } else {
      save_now = save_now || save_pending;
      stop = stop || stop_pending;
      save_pending = stop_pending = false;
    }
    if (save_now && !stop) {
      save(step, loader.position(), summary, /*last=*/false);
      last_save = std::chrono::steady_clock::now();
    }
  }
  progress.finish();
  summary.steps = step;
  summary.micro_batch = layout_.micro_batch();
  summary.finished = step == total;
  summary.position = loader.position();
  if (!layout_.replicas_agree()) layout_.average_replicas();  // the run's end: one model
  if (on_trained) on_trained();

  // The end's checkpoint (or the stop's); its write is waited for, which holds no step.
  save(step, summary.position, summary, /*last=*/true);
  if (writer_) {
    writer_->wait();
    summary.checkpoints = writer_->writes();
    summary.checkpoint_write_seconds = writer_->seconds_writing();
    summary.checkpoint = (out / kCheckpointFile).string();
  }
  summary.weights_sha256 = weights_sha256(*trained_);
  if (options_.leader && !out.empty() && options_.write_summary) {
    nlohmann::json json = {{"steps", summary.steps},
                           {"finished", summary.finished},
                           {"resumed_from", summary.resumed_from},
                           {"loss", summary.loss},
                           {"train_seconds", summary.seconds},
                           {"samples_per_second", summary.samples_per_second},
                           {"batch_size", options_.batch_size},
                           {"seed", options_.seed},
                           {"checkpoints", summary.checkpoints},
                           {"checkpoint_hold_seconds", summary.checkpoint_hold_seconds},
                           {"checkpoint_write_seconds", summary.checkpoint_write_seconds},
                           {"weights_sha256", summary.weights_sha256}};
    add_micro_batch(json, summary);
    write_json_file((out / "summary.json").string(), json);
  }
  return summary;
}

parallel::StepResult Trainer::step_layout(const TensorBatch& samples, const parallel::StepContext& context,
                                          TrainSummary& summary, ProgressBar& progress) {
  for (;;) {
    try {
      return layout_.step(samples, context);
    } catch (const OutOfMemoryError& e) {
      if (!options_.halve_micro_batch_on_out_of_memory) throw;
      const int64_t from = layout_.micro_batch();
      const std::string refused =
          from > 1 ? layout_.set_micro_batch(from / 2, samples.size()) : "the micro-batch holds one sample already";
      if (!refused.empty()) throw OutOfMemoryError(std::string(e.what()) + "; no smaller micro-batch: " + refused);
      const MicroBatchChange change{
          .step = static_cast<int64_t>(context.step) + 1, .from = from, .to = from / 2, .error = e.what()};
      summary.micro_batch_changes.push_back(change);
      if (on_micro_batch_change) {
        on_micro_batch_change(change);
      } else if (options_.leader) {
        progress.finish();
        std::fprintf(stderr,
                     "step %lld ran out of memory with micro-batch %lld (%s); taking it again with micro-batch %lld, "
                     "the global batch unchanged. The micro-batch is part of the result: this run's is %lld from "
                     "step %lld on\n",
                     static_cast<long long>(change.step), static_cast<long long>(from), e.what(),
                     static_cast<long long>(change.to), static_cast<long long>(change.to),
                     static_cast<long long>(change.step));
      }
    }
  }
}

void Trainer::save(int64_t step, const LoaderPosition& position, TrainSummary& summary, bool last) {
  const comm::FlightPhase phase("checkpoint");
  const auto start = std::chrono::steady_clock::now();
  // Collective under sharded layouts: the leader (process 0) assembles and writes; the
  // others send their shards and keep no full copy (but for the last save's model, which
  // trained_model() gives every rank). Without out_dir (the same on every process) nothing
  // is written, and only the last save assembles the model.
  const bool writes = !options_.out_dir.empty();
  if (!writes && !last) return;
  const NamedTensors optimizer_state = writes ? layout_.optimizer_state_on(0) : NamedTensors{};
  nn::Module* model = last ? &layout_.model() : layout_.model_on(0);
  if (last) trained_ = model;
  if (writer_) {
    LOCKSTEP_CHECK(model != nullptr) << "the layout assembled no model on process 0 for its checkpoint";
    NamedTensors tensors;
    for (const auto& [name, tensor] : model->state_dict()) tensors.emplace_back(kModelPrefix + name, tensor);
    for (const auto& [name, tensor] : optimizer_state) tensors.emplace_back(kOptimizerPrefix + name, tensor);
    Metadata metadata = options_.recipe;
    metadata["step"] = std::to_string(step);
    metadata["epoch"] = std::to_string(position.epoch);
    metadata["sample"] = std::to_string(position.sample);
    metadata["seed"] = std::to_string(options_.seed);
    metadata["batch_size"] = std::to_string(options_.batch_size);
    if (layout_.micro_batch() > 0) metadata["micro_batch"] = std::to_string(layout_.micro_batch());
    writer_->write(step, tensors, std::move(metadata));
    saved_step_ = step;
  }
  summary.checkpoint_hold_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

nn::Module& Trainer::trained_model() const {
  LOCKSTEP_CHECK(trained_ != nullptr) << "Trainer::trained_model: fit() has not run";
  return *trained_;
}

void add_micro_batch(nlohmann::json& json, const TrainSummary& summary) {
  if (summary.micro_batch > 0) json["micro_batch"] = summary.micro_batch;
  nlohmann::json changes = nlohmann::json::array();
  for (const MicroBatchChange& change : summary.micro_batch_changes)
    changes.push_back({{"step", change.step}, {"from", change.from}, {"to", change.to}, {"error", change.error}});
  json["micro_batch_changes"] = changes;
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
