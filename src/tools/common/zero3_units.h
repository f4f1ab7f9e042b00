// Which modules `lockstep train --strategy zero3` gathers one at a time, per built-in model
// (DistributedDataParallelOptions::zero3_unit_types), so the planner predicts what the
// trainer does. The GPT's head multiplies by the embedding's weight in the model's own
// forward, so only its blocks are units; the image models' top-level layers all are.
#pragma once

#include <string>
#include <vector>

namespace lockstep::tools {

inline std::vector<std::string> zero3_unit_types(const std::string& model) {
  return model == "gpt" ? std::vector<std::string>{"GptBlock"} : std::vector<std::string>{};
}

}  // namespace lockstep::tools
