#include "lockstep/parallel/pipeline_schedule.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "lockstep/core/error.h"

namespace lockstep::parallel {

PipelineSchedule parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::gpipe;
  if (name == "1f1b") return PipelineSchedule::one_f_one_b;
  LOCKSTEP_FAIL() << "--schedule must be gpipe (every forward, then every backward) or 1f1b (one forward, one "
                     "backward: less activation memory), got '"
                  << name << "'";
  std::abort();  // unreachable: the line above throws
}

const char* pipeline_schedule_name(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::gpipe ? "gpipe" : "1f1b";
}

std::vector<PipelineOp> pipeline_ops(PipelineSchedule schedule, int stage, int stages, int64_t micro_batches) {
  LOCKSTEP_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1)
      << "pipeline_ops: stage " << stage << " of " << stages << " with " << micro_batches << " micro-batches";
  std::vector<PipelineOp> ops;
  // GPipe is 1F1B with every forward in the warm-up.
  const int64_t warmup =
      schedule == PipelineSchedule::gpipe ? micro_batches : std::min<int64_t>(stages - stage - 1, micro_batches);
  int64_t next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) ops.push_back({true, next_forward});
  while (next_forward < micro_batches) {
    ops.push_back({true, next_forward++});
    ops.push_back({false, next_backward++});
  }
  while (next_backward < micro_batches) ops.push_back({false, next_backward++});
  return ops;
}

int64_t most_in_flight(const std::vector<PipelineOp>& ops) {
  int64_t held = 0, most = 0;
  for (const PipelineOp& op : ops) {
    held += op.forward ? 1 : -1;
    most = std::max(most, held);
  }
  return most;
}

double theoretical_bubble(int stages, int64_t micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

std::vector<int64_t> balance_layers(const std::vector<int64_t>& layer_params, int stages) {
  const auto layers = static_cast<int64_t>(layer_params.size());
  LOCKSTEP_CHECK(stages >= 1 && layers >= stages)
      << layers << " layers cannot fill " << stages << " pipeline stages (each stage holds at least one layer): use "
      << "at most " << layers << " stages";
  std::vector<int64_t> prefix(layer_params.size() + 1, 0);  // prefix[k]: the first k layers' parameters
  for (size_t k = 0; k < layer_params.size(); ++k) prefix[k + 1] = prefix[k] + layer_params[k];
  // best[s][k]: the smallest largest stage when stages 0..s-1 hold the first k layers.
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  const auto n = static_cast<size_t>(layers + 1);
  std::vector<std::vector<int64_t>> best(static_cast<size_t>(stages) + 1, std::vector<int64_t>(n, kNone));
  std::vector<std::vector<int64_t>> take(best.size(), std::vector<int64_t>(n, 0));
  best[0][0] = 0;
  for (int s = 0; s < stages; ++s) {
    // Earlier stages holding more layers come first, so ties leave the extra layer with them.
    for (int64_t k = layers; k >= 0; --k) {
      if (best[s][static_cast<size_t>(k)] == kNone) continue;
      for (int64_t count = layers - k; count >= 1; --count) {
        const int64_t cost = prefix[static_cast<size_t>(k + count)] - prefix[static_cast<size_t>(k)];
        const int64_t worst = std::max(best[s][static_cast<size_t>(k)], cost);
        int64_t& slot = best[static_cast<size_t>(s) + 1][static_cast<size_t>(k + count)];
        if (worst < slot) {
          slot = worst;
          take[static_cast<size_t>(s) + 1][static_cast<size_t>(k + count)] = count;
        }
      }
    }
  }
  std::vector<int64_t> sizes(static_cast<size_t>(stages));
  for (int64_t s = stages, k = layers; s > 0; --s) {
    sizes[static_cast<size_t>(s) - 1] = take[static_cast<size_t>(s)][static_cast<size_t>(k)];
    k -= sizes[static_cast<size_t>(s) - 1];
  }
  return sizes;
}

std::vector<int64_t> balance_stages(int64_t blocks, int64_t block_params, int64_t first_extra, int64_t last_extra,
                                    int stages) {
  LOCKSTEP_CHECK(stages >= 1 && blocks >= stages)
      << blocks << " transformer blocks cannot fill " << stages
      << " pipeline stages (each stage holds at least one block): use --pp at most " << blocks
      << " or a model with more --layers";
  // The first stage always holds the first block and the last stage the last: their extras
  // count as those blocks'.
  std::vector<int64_t> params(static_cast<size_t>(blocks), block_params);
  params.front() += first_extra;
  params.back() += last_extra;
  return balance_layers(params, stages);
}

std::vector<int64_t> parse_stage_sizes(const std::string& text, int64_t blocks, int stages) {
  std::vector<int64_t> sizes;
  std::istringstream in(text);
  std::string item;
  int64_t total = 0;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t count = 0;
    try {
      count = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    LOCKSTEP_CHECK(used == item.size() && !item.empty() && count >= 1)
        << "--stages " << text << ": '" << item << "' is not a positive block count (give blocks per stage, e.g. 3,1)";
    sizes.push_back(count);
    total += count;
  }
  LOCKSTEP_CHECK(static_cast<int>(sizes.size()) == stages && total == blocks)
      << "--stages " << text << " gives " << sizes.size() << " stage(s) holding " << total
      << " block(s); the model has " << blocks << " blocks in " << stages << " pipeline stages (--pp): give " << stages
      << " counts that sum to " << blocks;
  return sizes;
}

}  // namespace lockstep::parallel
