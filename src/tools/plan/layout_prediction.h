// The layouts a model can take on a machine's devices, and for each the predicted peak
// memory of its largest device and its step time: pure arithmetic over ModelFacts (what
// the model measured) and a MachineProfile, so tests check it on hand-made facts.
//
// Memory per device, in bytes, for P parameters the device trains (fp32 master weights):
//   parameters   4 P (and 4 B per element of a copy it holds, the last stage's tied head)
//   optimizer    AdamW 8 P, SGD with momentum 4 P, plain SGD 0; divided by dp under ZeRO
//   gradients    one device and the mesh: every micro-batch's gradients and the sums the
//                tree holds (gradient_tree.h folds like a binary counter: up to log2 of the
//                micro-batches), ZeRO-1's reduced shard 4 P / dp; ddp: the step's buffer
//                4 P, into which the last micro-batch goes straight, and the tree's other
//                copies; ZeRO-1 adds its shard, ZeRO-2 keeps the shard and five buckets (or,
//                accumulating, a full-size sum of the earlier micro-batches) instead of the
//                buffer
//   activations  what forward keeps per sample (per block, the embeddings on the first
//                stage, the head on the last) times the samples of the micro-batches in
//                flight (pipeline_schedule.h's most_in_flight: 1F1B P - stage, GPipe all of
//                a replica's), and once what backward adds while it runs; a tensor-parallel
//                rank keeps its heads' and MLP columns' share of a block and all of the rest
//   workspace    what a micro-batch needs whatever its size
// CPU devices of one host under ddp or ZeRO share one copy of the stepped weights, the
// optimizer state and the reduced gradients (distributed_data_parallel.h's share_weights):
// those count once for the host, not per device.
// Step time: the compute of the replica's micro-batches on the slowest stage (measured
// seconds on CPU devices, counted FLOPs at the machine's rate on GPUs), one step of the
// optimizer over the device's share at memory bandwidth, the communication that does not
// overlap with compute (tensor parallelism's all-reduces, the pipeline's sends, the
// gradients' reduction beyond the last micro-batch's backward on GPUs) and the bubble.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/parallel/pipeline_schedule.h"
#include "tools/plan/machine_profile.h"
#include "tools/plan/model_facts.h"

namespace lockstep::tools {

struct LayoutChoice {
  int dp = 1, tp = 1, pp = 1;
  int zero = 0;  // 0; under ddp 1, 2 or 3; on a mesh of several replicas 1
  parallel::PipelineSchedule schedule = parallel::PipelineSchedule::one_f_one_b;
  int64_t micro_batch = 1;
  bool checkpoint_activations = false;
  std::string precision = "f32";
  // "dp 8 zero1", "dp 2 x tp 2 x pp 2 1f1b", plus " micro-batch m" and " checkpointed".
  std::string name() const;
  // The `lockstep train` flags that run it, and what starts it: one process per device for
  // ddp and ZeRO ("lockstep run -n 8 -- "), else nothing.
  std::string train_flags() const;
  std::string launcher() const;
};

struct MemoryBreakdown {
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0, workspace = 0;
  double total() const { return parameters + gradients + optimizer + activations + workspace; }
};

struct TimeBreakdown {
  double compute = 0, optimizer = 0, communication = 0, bubble = 0;
  double total() const { return compute + optimizer + communication + bubble; }
};

struct LayoutPrediction {
  LayoutChoice layout;
  int largest_stage = 0;             // the pipeline stage whose device needs the most memory
  MemoryBreakdown memory;            // of that device
  std::vector<double> stage_memory;  // every stage's device's total
  // CPU devices under ddp or ZeRO: what their processes share, once for the host (the
  // stepped weights, the optimizer state, the reduced gradients), not in any device's total.
  double host_shared_bytes = 0;
  TimeBreakdown time;
  bool fits = false;
  std::string why_not;  // when it does not fit: what it needs against what the device has
  double samples_per_second = 0;
};

struct PlanRequest {
  int64_t batch = 0;
  int devices = 1;
  std::string optimizer = "adamw";  // "adamw", "sgd" (with momentum) or "sgd-plain"
  std::string precision = "f32";
  int64_t micro_batch = 0;  // 0: every micro-batch that divides a replica's share
};

// Every layout the devices divide into: dp x tp x pp = devices with tp dividing the heads
// and the vocabulary and pp at most the blocks (the GPT), ZeRO 1-3 under pure data
// parallelism and ZeRO-1 on meshes of several replicas, both schedules under pipelines, the
// micro-batches (powers of two and the whole share) that divide a replica's share,
// activation checkpointing on and off. A UsageError when none does (the batch cannot be
// split over the devices).
std::vector<LayoutChoice> candidate_layouts(const ModelFacts& model, const PlanRequest& request);

LayoutPrediction predict_layout(const ModelFacts& model, const MachineProfile& machine, const PlanRequest& request,
                                const LayoutChoice& layout);

// "1.25 GiB", or "512.0 MiB" below a GiB.
std::string memory_text(double bytes);

// Every candidate predicted: those that fit first, fastest first; then the others, least
// memory first.
std::vector<LayoutPrediction> plan_layouts(const ModelFacts& model, const MachineProfile& machine,
                                           const PlanRequest& request);

}  // namespace lockstep::tools
