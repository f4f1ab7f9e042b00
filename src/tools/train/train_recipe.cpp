#include "tools/train/train_recipe.h"

#include <charconv>
#include <cmath>

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

// 2: the Trainer's checkpoint (data position under "sample") with the whole recipe.
constexpr const char* kFormat = "lockstep-train-2";

const std::string& meta(const Metadata& checkpoint, const std::string& path, const std::string& key) {
  const auto it = checkpoint.find(key);
  LOCKSTEP_CHECK(it != checkpoint.end())
      << path << " is not a Lockstep training checkpoint of this version: its metadata has no '" << key << "'";
  return it->second;
}

// The shortest text that reads back as the same double, so a saved rate is exact.
std::string exact(double value) {
  char text[64];
  const auto [end, error] = std::to_chars(text, text + sizeof(text), value);
  return error == std::errc() ? std::string(text, end) : std::to_string(value);
}

// A checkpoint's number, all of its text: "1e5" for an integer, "12abc" or an unsigned "-1"
// are errors, not 1, 12, 2^64-1.
template <typename Number>
Number parse(const std::string& text, const std::string& path, const std::string& key) {
  Number value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  bool ok = error == std::errc() && end == text.data() + text.size() && !text.empty();
  if constexpr (std::is_floating_point_v<Number>) ok = ok && std::isfinite(value);
  LOCKSTEP_CHECK(ok) << path << ": metadata '" << key << "' should be a number, got '" << text << "'";
  return value;
}

class Reconciler {
 public:
  Reconciler(const Metadata& checkpoint, const std::string& path, const std::function<bool(const std::string&)>& given)
      : checkpoint_(checkpoint), path_(path), given_(given) {}

  // The checkpoint's value where the flag was not given; an error naming both where the
  // flag says otherwise.
  void text(const std::string& flag, const std::string& key, std::string& value) const {
    const std::string& saved = meta(checkpoint_, path_, key);
    if (!given_(flag)) {
      value = saved;
      return;
    }
    LOCKSTEP_CHECK(value == saved) << path_ << " is a checkpoint of a run with --" << flag << " " << shown(saved)
                                   << ", not " << shown(value) << ": resume with --" << flag << " " << shown(saved)
                                   << " (or leave the flag out)";
  }
  template <typename Number>
  void number(const std::string& flag, const std::string& key, Number& value) const {
    std::string text_value = format(value);
    text(flag, key, text_value);
    value = parse<Number>(text_value, path_, key);
  }

 private:
  template <typename Number>
  static std::string format(Number value) {
    if constexpr (std::is_floating_point_v<Number>) {
      return exact(value);
    } else {
      return std::to_string(value);
    }
  }
  static std::string shown(const std::string& value) { return value.empty() ? "(the default)" : value; }

  const Metadata& checkpoint_;
  const std::string& path_;
  const std::function<bool(const std::string&)>& given_;
};

}  // namespace

Metadata train_recipe(const TrainOptions& options) {
  // The random state is the seed alone: data order, initialization and dropout masks are
  // counter-based draws keyed by (seed, epoch, step, sample), so step and data position
  // restore them. The length (--epochs, --steps) and the schedule as given fix the
  // schedule's resolved length, so a resumed run keeps its learning rates.
  Metadata recipe = {
      {"format", kFormat},
      {"model", options.model},
      {"optimizer", options.optimizer},
      {"lr", exact(options.lr)},
      {"momentum", exact(options.momentum)},
      {"weight_decay", exact(options.weight_decay)},
      {"label_smoothing", exact(options.label_smoothing)},
      {"lr_schedule", options.lr_schedule},
      {"epochs", std::to_string(options.epochs)},
      {"steps", std::to_string(options.steps)},
      {"precision", options.precision},
      {"grad_dtype", options.grad_dtype},
      {"sync_every", std::to_string(options.sync_every)},
      {"powersgd_rank", std::to_string(options.powersgd_rank)},
      {"powersgd_start", std::to_string(options.powersgd_start)},
      {"data", options.data_dir},
  };
  if (options.model == "gpt") {
    // The shape, resolved: a resume builds the same model whatever its flags default to.
    recipe["preset"] = options.preset;
    recipe["layers"] = std::to_string(options.layers);
    recipe["heads"] = std::to_string(options.heads);
    recipe["width"] = std::to_string(options.width);
    recipe["context"] = std::to_string(options.context);
  }
  return recipe;
}

void apply_checkpoint_settings(const Metadata& checkpoint, const std::string& path, TrainOptions& options,
                               const std::function<bool(const std::string&)>& given) {
  LOCKSTEP_CHECK(meta(checkpoint, path, "format") == kFormat)
      << path << " has format '" << meta(checkpoint, path, "format") << "', this build reads '" << kFormat << "'";
  const Reconciler recipe(checkpoint, path, given);
  recipe.text("model", "model", options.model);
  recipe.text("optimizer", "optimizer", options.optimizer);
  recipe.number("lr", "lr", options.lr);
  recipe.number("momentum", "momentum", options.momentum);
  recipe.number("weight-decay", "weight_decay", options.weight_decay);
  recipe.text("lr-schedule", "lr_schedule", options.lr_schedule);
  recipe.number("epochs", "epochs", options.epochs);
  recipe.number("steps", "steps", options.steps);
  recipe.number("seed", "seed", options.seed);
  recipe.number("batch-size", "batch_size", options.batch_size);
  // The micro-batch shapes the step's tree, so the run resumes with the one it had (the
  // Trainer keeps it: a step that ran out of memory may have halved it); the device count
  // is free.
  recipe.number("micro-batch", "micro_batch", options.micro_batch);
  recipe.text("precision", "precision", options.precision);
  // bf16 gradients, local SGD and PowerSGD shape the step: part of the recipe. Checkpoints
  // from before these flags were all f32 all-reduces, every step.
  Metadata with_defaults = checkpoint;
  with_defaults.emplace("grad_dtype", "f32");
  with_defaults.emplace("sync_every", "1");
  with_defaults.emplace("powersgd_rank", "0");
  with_defaults.emplace("powersgd_start", "10");
  with_defaults.emplace("label_smoothing", "0");
  const Reconciler newer(with_defaults, path, given);
  newer.text("grad-dtype", "grad_dtype", options.grad_dtype);
  newer.number("sync-every", "sync_every", options.sync_every);
  newer.number("powersgd-rank", "powersgd_rank", options.powersgd_rank);
  newer.number("powersgd-start", "powersgd_start", options.powersgd_start);
  newer.number("label-smoothing", "label_smoothing", options.label_smoothing);
  // The data as the run named it; a resume may name another path to the same data (moved,
  // or mounted elsewhere), which the checkpoint cannot check.
  if (!given("data")) options.data_dir = meta(checkpoint, path, "data");
  if (options.model == "gpt") {
    recipe.text("preset", "preset", options.preset);
    recipe.number("layers", "layers", options.layers);
    recipe.number("heads", "heads", options.heads);
    recipe.number("width", "width", options.width);
    recipe.number("context", "context", options.context);
  }
}

}  // namespace lockstep::tools
