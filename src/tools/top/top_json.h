// One sample of `lockstep top` as a JSON object: what `--json` prints, one line per sample,
// and what a `.jsonl` log holds. Sizes are bytes, power watts, times UTC.
#pragma once

#include <nlohmann/json.hpp>

#include "tools/top/top_sample.h"

namespace lockstep::tools {

nlohmann::json sample_json(const TopSample& sample);

}  // namespace lockstep::tools
