#include "tools/train/train_checkpoint.h"

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

constexpr const char* kFormat = "lockstep-train-1";

const std::string& meta(const Checkpoint& checkpoint, const std::string& path, const std::string& key) {
  const auto it = checkpoint.metadata.find(key);
  LOCKSTEP_CHECK(it != checkpoint.metadata.end())
      << path << " is not a Lockstep training checkpoint: its metadata has no '" << key << "'";
  return it->second;
}

int64_t meta_int(const Checkpoint& checkpoint, const std::string& path, const std::string& key) {
  const std::string& text = meta(checkpoint, path, key);
  try {
    size_t used = 0;
    const int64_t value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  LOCKSTEP_FAIL() << path << ": metadata '" << key << "' should be an integer, got '" << text << "'";
  return 0;
}

// Tensors whose names start with prefix, with the prefix removed.
NamedTensors with_prefix(const Checkpoint& checkpoint, const std::string& prefix) {
  NamedTensors out;
  for (const auto& [name, tensor] : checkpoint.tensors)
    if (name.rfind(prefix, 0) == 0) out.emplace_back(name.substr(prefix.size()), tensor);
  return out;
}

}  // namespace

void save_train_checkpoint(const std::string& path, const TrainOptions& options, const nn::Module& model,
                           const NamedTensors& optimizer_state, const RunPosition& position) {
  NamedTensors tensors;
  for (const auto& [name, tensor] : model.state_dict()) tensors.emplace_back("model." + name, tensor);
  for (const auto& [name, tensor] : optimizer_state) tensors.emplace_back("optim." + name, tensor);
  // The random state is the seed alone: data order, initialization and dropout masks are
  // counter-based draws keyed by (seed, epoch, step, sample), so step and data position
  // restore them.
  Metadata metadata = {
      {"format", kFormat},
      {"model", options.model},
      {"optimizer", options.optimizer},
      {"seed", std::to_string(options.seed)},
      {"batch_size", std::to_string(options.batch_size)},
      {"micro_batch", std::to_string(options.micro_batch)},
      {"step", std::to_string(position.step)},
      {"epoch", std::to_string(position.data.epoch)},
      {"epoch_sample", std::to_string(position.data.sample)},
  };
  if (options.model == "gpt") {
    // The shape, resolved: a resume builds the same model whatever its flags default to.
    metadata["preset"] = options.preset;
    metadata["layers"] = std::to_string(options.layers);
    metadata["heads"] = std::to_string(options.heads);
    metadata["width"] = std::to_string(options.width);
    metadata["context"] = std::to_string(options.context);
  }
  save_checkpoint(path, tensors, metadata);
}

void apply_checkpoint_settings(const Checkpoint& checkpoint, const std::string& path, TrainOptions& options,
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
      *value = std::stoll(text);
    }
  }
  options.seed = std::stoull(seed);
  options.batch_size = std::stoll(batch);
  options.micro_batch = std::stoll(micro);
}

RunPosition restore_train_checkpoint(const Checkpoint& checkpoint, const std::string& path, nn::Module& model,
                                     const std::function<void(const NamedTensors&)>& load_optimizer) {
  try {
    model.load_state_dict(with_prefix(checkpoint, "model."));
    load_optimizer(with_prefix(checkpoint, "optim."));
  } catch (const Error& e) {
    LOCKSTEP_FAIL() << path << " does not fit this model: " << e.what();
  }
  RunPosition position;
  position.step = meta_int(checkpoint, path, "step");
  position.data.epoch = meta_int(checkpoint, path, "epoch");
  position.data.sample = meta_int(checkpoint, path, "epoch_sample");
  return position;
}

}  // namespace lockstep::tools
