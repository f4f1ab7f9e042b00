// The GPT's shape from the flags `lockstep train` and `lockstep plan` share: --preset, then
// --layers/--heads/--width/--context over it (0: the preset's). Bad values are UsageErrors
// that name the flag.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/nn/gpt.h"

namespace lockstep::tools {

struct GptShapeFlags {
  std::string preset;
  int64_t layers = 0, heads = 0, width = 0, context = 0;
};

nn::GptConfig gpt_shape(const GptShapeFlags& flags);

}  // namespace lockstep::tools
