// The order in which a pipeline stage runs the forward and backward passes of a step's M
// micro-batches (GPipe, 1F1B), how the layers are cut into stages, and the idle share
// ("bubble") an ideal pipeline has. Backward passes run in micro-batch order under both
// schedules, so each stage folds its gradients into the step's tree as they come, in the
// order one device would.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::parallel {

enum class PipelineSchedule {
  gpipe,        // every forward, then every backward: M micro-batches of activations held
  one_f_one_b,  // after P - stage warm-up forwards, one forward then one backward: at most P held
};

// "gpipe" or "1f1b"; an Error names the choices.
PipelineSchedule parse_pipeline_schedule(const std::string& name);
const char* pipeline_schedule_name(PipelineSchedule schedule);

struct PipelineOp {
  bool forward = true;
  int64_t micro_batch = 0;
};

// Stage `stage` (0 .. stages-1)'s passes, in order.
std::vector<PipelineOp> pipeline_ops(PipelineSchedule schedule, int stage, int stages, int64_t micro_batches);

// The most micro-batches whose forward has run and backward has not, over `ops`: how many
// micro-batches of activations the stage holds at its peak.
int64_t most_in_flight(const std::vector<PipelineOp>& ops);

// The idle share of each stage in an ideal pipeline with equal stages: (P-1)/(M+P-1).
double theoretical_bubble(int stages, int64_t micro_batches);

// Blocks per stage that balance the stages' parameter counts (the first stage also holds
// the embeddings, `first_extra` parameters; the last the final norm, `last_extra`), each
// stage at least one block; earlier stages take the extra block where it does not matter.
// An Error when there are fewer blocks than stages.
std::vector<int64_t> balance_stages(int64_t blocks, int64_t block_params, int64_t first_extra, int64_t last_extra,
                                    int stages);

// Layers per stage for a stack of layers holding layer_params[i] parameters each: contiguous
// runs, each stage at least one layer, the largest stage as small as can be; earlier stages
// take the extra layer where it does not matter. An Error when there are fewer layers than
// stages.
std::vector<int64_t> balance_layers(const std::vector<int64_t>& layer_params, int stages);

// "--stages 3,1": blocks per stage, checked to be `stages` positive counts summing to
// `blocks`; the Error says what sums to what.
std::vector<int64_t> parse_stage_sizes(const std::string& text, int64_t blocks, int stages);

}  // namespace lockstep::parallel
