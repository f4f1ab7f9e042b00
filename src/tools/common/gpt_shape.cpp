#include "tools/common/gpt_shape.h"

#include <utility>

#include "lockstep/core/error.h"

namespace lockstep::tools {

nn::GptConfig gpt_shape(const GptShapeFlags& flags) {
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"--layers", flags.layers},
                                    {"--heads", flags.heads},
                                    {"--width", flags.width},
                                    {"--context", flags.context}}) {
    if (value < 0) {
      throw UsageError(std::string(flag) + " must be positive (leave it out for the preset's), got " +
                       std::to_string(value));
    }
  }
  nn::GptConfig config;
  try {
    config = nn::gpt_preset(flags.preset);
  } catch (const Error& e) {
    throw UsageError(std::string("--preset: ") + e.what());
  }
  if (flags.layers > 0) config.layers = flags.layers;
  if (flags.heads > 0) config.heads = flags.heads;
  if (flags.width > 0) config.width = flags.width;
  if (flags.context > 0) config.context = flags.context;
  try {
    nn::check_gpt_config(config);
  } catch (const Error& e) {
    throw UsageError(std::string("--model gpt: ") + e.what() + " (set by --preset, --layers, --heads, --width)");
  }
  return config;
}

}  // namespace lockstep::tools
