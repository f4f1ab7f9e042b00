#include "tools/train/train_recipe.h"

#include <charconv>

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

// 2: the Trainer's checkpoint (data position under "sample").
constexpr const char* kFormat = "lockstep-train-2";

const std::string& meta(const Metadata& checkpoint, const std::string& path, const std::string& key) {
  const auto it = checkpoint.find(key);
  LOCKSTEP_CHECK(it != checkpoint.end()) << path << " is not a Lockstep training checkpoint: its metadata has no '"
                                         << key << "'";
  return it->second;
}

// A checkpoint's number, all of its text: "1e5", "-1" or "12abc" are errors, not 1, 2^64-1, 12.
uint64_t whole_number(const std::string& text, const std::string& path, const std::string& key) {
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  LOCKSTEP_CHECK(error == std::errc() && end == text.data() + text.size() && !text.empty())
      << path << ": metadata '" << key << "' should be a whole number, got '" << text << "'";
  return value;
}

}  // namespace

Metadata train_recipe(const TrainOptions& options) {
  // The random state is the seed alone: data order, initialization and dropout masks are
  // counter-based draws keyed by (seed, epoch, step, sample), so step and data position
  // restore them.
  Metadata recipe = {
      {"format", kFormat},
      {"model", options.model},
      {"optimizer", options.optimizer},
      {"micro_batch", std::to_string(options.micro_batch)},
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
  auto reconcile = [&](const std::string& flag, const std::string& key, std::string& value) {
    const std::string& saved = meta(checkpoint, path, key);
    if (!given(flag)) {
      value = saved;
      return;
    }
    LOCKSTEP_CHECK(value == saved) << path << " is a checkpoint of a run with --" << flag << " " << saved << ", not "
                                   << value << ": resume with --" << flag << " " << saved << " (or leave the flag out)";
  };
  std::string seed = std::to_string(options.seed), batch = std::to_string(options.batch_size),
              micro = std::to_string(options.micro_batch);
  reconcile("model", "model", options.model);
  reconcile("optimizer", "optimizer", options.optimizer);
  reconcile("seed", "seed", seed);
  reconcile("batch-size", "batch_size", batch);
  // The micro-batch shapes the step's tree, so the run resumes with the one it had; the
  // device count is free.
  reconcile("micro-batch", "micro_batch", micro);
  if (options.model == "gpt") {
    reconcile("preset", "preset", options.preset);
    for (auto [flag, value] : {std::pair<const char*, int64_t*>{"layers", &options.layers},
                               {"heads", &options.heads},
                               {"width", &options.width},
                               {"context", &options.context}}) {
      std::string text = std::to_string(*value);
      reconcile(flag, flag, text);
      *value = static_cast<int64_t>(whole_number(text, path, flag));
    }
  }
  options.seed = whole_number(seed, path, "seed");
  options.batch_size = static_cast<int64_t>(whole_number(batch, path, "batch_size"));
  options.micro_batch = static_cast<int64_t>(whole_number(micro, path, "micro_batch"));
}

}  // namespace lockstep::tools
