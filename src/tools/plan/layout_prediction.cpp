#include "tools/plan/layout_prediction.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>

#include "lockstep/core/error.h"
#include "lockstep/parallel/gpt_mesh.h"

namespace lockstep::tools {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// ddp's default bucket (--bucket-mb 25); a ZeRO-2 rank holds about five at its peak (two
// being sent, the one filling, the next two made ahead: the README's gpt_layout_memory rows).
constexpr double kBucketBytes = 25.0 * 1024 * 1024;
constexpr double kZero2BucketsHeld = 5;
// Of a block's activations, the share a tensor-parallel rank cuts (q, k, v, the attention
// matrices, the MLP's hidden columns); the layer norms' inputs and outputs and the residual
// stream stay whole on every rank (Megatron-LM without sequence parallelism): 6 of a
// block's 34 activation tensors per token and width (Korthikanti et al., 2022).
constexpr double kTensorParallelCutShare = 24.0 / 34.0;
// The kernels a micro-batch launches, forward and backward: about 22 per block forward
// (norms, four products with their biases, the heads' reshapes, the attention's products,
// mask and softmax, GELU, residual adds), twice that backward; the embeddings, head and loss.
constexpr double kKernelsPerBlock = 66, kKernelsRest = 20;

// The most sums the gradient tree holds besides the leaf being computed, over a replica's k
// micro-batches: the most set bits of any i < k (gradient_tree.h folds like a binary counter).
int pending_sums(int64_t k) {
  int most = 0;
  for (int64_t i = 0; i < k; ++i) most = std::max(most, std::popcount(static_cast<uint64_t>(i)));
  return most;
}

// Under ddp and ZeRO the last micro-batch's gradients go straight into the step's buffer
// (reduced bucket by bucket as backward makes them): the full-size gradients a rank holds
// beside that buffer are the tree's sums, and each earlier micro-batch's own gradients while
// it is computed.
int ddp_gradient_copies(int64_t k) {
  int most = std::popcount(static_cast<uint64_t>(k - 1));
  for (int64_t i = 0; i + 1 < k; ++i) most = std::max(most, std::popcount(static_cast<uint64_t>(i)) + 1);
  return most;
}

double optimizer_bytes_per_parameter(const std::string& optimizer) {
  if (optimizer == "adamw") return 8;
  if (optimizer == "sgd") return 4;
  return 0;
}

}  // namespace

std::string memory_text(double bytes) {
  char text[32];
  if (bytes >= kGiB) {
    std::snprintf(text, sizeof text, "%.2f GiB", bytes / kGiB);
  } else {
    std::snprintf(text, sizeof text, "%.1f MiB", bytes / (1024.0 * 1024.0));
  }
  return text;
}

namespace {

std::vector<int64_t> micro_batches_for(int64_t share, int64_t fixed) {
  std::vector<int64_t> sizes;
  if (fixed > 0) {
    if (share % fixed == 0) sizes.push_back(fixed);
    return sizes;
  }
  for (int64_t m = 1; m <= share; m *= 2) {
    if (share % m == 0) sizes.push_back(m);
  }
  if (sizes.empty() || sizes.back() != share) sizes.push_back(share);
  return sizes;
}

// Seconds of one forward and backward of `samples` samples of `cost` on a device.
double compute_seconds(const SampleCost& cost, double samples, const MachineProfile& machine,
                       const std::string& precision) {
  if (machine.cpu_devices) return cost.seconds * samples / machine.core_share;
  const double rate = machine.flops(precision);
  return rate > 0 ? cost.flops * samples / rate : INFINITY;
}

// An all-reduce of `bytes` over `ranks` (ring bus bandwidth: each byte crosses 2 (n-1)/n times).
double all_reduce_seconds(double bytes, int ranks, const MachineProfile& machine) {
  if (ranks <= 1) return 0;
  return machine.collective_latency_seconds + 2.0 * (ranks - 1) / ranks * bytes / machine.bus_bandwidth;
}

}  // namespace

std::string LayoutChoice::name() const {
  std::string text;
  const auto axis = [&](const char* label, int size) {
    if (size == 1) return;
    if (!text.empty()) text += " x ";
    text += label;
    text += std::to_string(size);
  };
  axis("dp ", dp);
  axis("tp ", tp);
  axis("pp ", pp);
  if (text.empty()) text = "1 device";
  if (zero > 0) text += " zero" + std::to_string(zero);
  if (pp > 1) text += std::string(" ") + parallel::pipeline_schedule_name(schedule);
  text += ", micro-batch " + std::to_string(micro_batch);
  if (checkpoint_activations) text += ", checkpointed";
  return text;
}

std::string LayoutChoice::train_flags() const {
  std::string flags;
  if (tp > 1 || pp > 1) {
    flags = std::string(zero == 1 ? "--strategy zero1" : "--strategy mesh") + " --dp " + std::to_string(dp) + " --tp " +
            std::to_string(tp) + " --pp " + std::to_string(pp);
    if (pp > 1) flags += std::string(" --schedule ") + parallel::pipeline_schedule_name(schedule);
  } else if (dp > 1) {
    flags = std::string("--strategy ") + (zero == 0 ? "ddp" : "zero" + std::to_string(zero));
  } else {
    flags = "--devices 1";
  }
  flags += " --micro-batch " + std::to_string(micro_batch);
  if (checkpoint_activations) flags += " --checkpoint-activations";
  if (precision != "f32") flags += " --precision " + precision;
  return flags;
}

std::string LayoutChoice::launcher() const {
  return dp > 1 && tp == 1 && pp == 1 ? "lockstep run -n " + std::to_string(dp) + " -- " : "";
}

std::vector<LayoutChoice> candidate_layouts(const ModelFacts& model, const PlanRequest& request) {
  if (request.batch < 1 || request.devices < 1) {
    throw UsageError("plan: --batch-size and --devices must be at least 1, got " + std::to_string(request.batch) +
                     " and " + std::to_string(request.devices));
  }
  std::vector<LayoutChoice> layouts;
  const int n = request.devices;
  for (int tp = 1; tp <= n; ++tp) {
    for (int pp = 1; tp * pp <= n; ++pp) {
      if (n % (tp * pp) != 0) continue;
      if ((tp > 1 || pp > 1) && !model.transformer) continue;
      if (model.transformer) {
        parallel::GptMeshOptions options;
        options.mesh = {.dp = 1, .tp = tp, .pp = pp};
        if (!parallel::check_gpt_mesh(model.gpt, options).empty()) continue;
      }
      const int dp = n / (tp * pp);
      if (request.batch % dp != 0) continue;
      // ZeRO 1-3 under ddp; the mesh shards the optimizer state across its replicas (1).
      const std::vector<int> zeros = dp == 1              ? std::vector<int>{0}
                                     : tp == 1 && pp == 1 ? std::vector<int>{0, 1, 2, 3}
                                                          : std::vector<int>{0, 1};
      const std::vector<parallel::PipelineSchedule> schedules =
          pp > 1 ? std::vector{parallel::PipelineSchedule::one_f_one_b, parallel::PipelineSchedule::gpipe}
                 : std::vector{parallel::PipelineSchedule::one_f_one_b};
      for (const int zero : zeros) {
        for (const parallel::PipelineSchedule schedule : schedules) {
          for (const int64_t m : micro_batches_for(request.batch / dp, request.micro_batch)) {
            for (const bool checkpoint : model.transformer ? std::vector{false, true} : std::vector{false}) {
              layouts.push_back({.dp = dp,
                                 .tp = tp,
                                 .pp = pp,
                                 .zero = zero,
                                 .schedule = schedule,
                                 .micro_batch = m,
                                 .checkpoint_activations = checkpoint,
                                 .precision = request.precision});
            }
          }
        }
      }
    }
  }
  if (layouts.empty()) {
    throw UsageError("plan: no layout splits a batch of " + std::to_string(request.batch) + " over " +
                     std::to_string(n) + " devices" +
                     (request.micro_batch > 0 ? " in micro-batches of " + std::to_string(request.micro_batch) : "") +
                     "; use a --batch-size that " + std::to_string(n) + " divides" +
                     (request.micro_batch > 0 ? " and a --micro-batch that divides each device's share" : ""));
  }
  return layouts;
}

LayoutPrediction predict_layout(const ModelFacts& model, const MachineProfile& machine, const PlanRequest& request,
                                const LayoutChoice& layout) {
  LayoutPrediction prediction;
  prediction.layout = layout;
  const int64_t k = request.batch / layout.dp / layout.micro_batch;  // micro-batches per replica
  const double m = static_cast<double>(layout.micro_batch);
  const double sharded = layout.zero > 0 ? layout.dp : 1;
  const double tp_share = kTensorParallelCutShare / layout.tp + (1 - kTensorParallelCutShare);
  // ZeRO-3 keeps each rank's part of the weights, nothing to share.
  const bool shared_weights =
      machine.cpu_devices && layout.dp > 1 && layout.tp == 1 && layout.pp == 1 && layout.zero < 3;

  double slowest_micro_batch = 0;  // seconds of the slowest stage's forward and backward of one micro-batch
  double largest_trained = 0;
  for (int stage = 0; stage < layout.pp; ++stage) {
    const DeviceShare share = model.share(layout.tp, layout.pp, stage);
    const double p = static_cast<double>(share.trained);
    largest_trained = std::max(largest_trained, p);
    MemoryBreakdown memory;
    memory.parameters = 4 * (p + static_cast<double>(share.copied));
    // ZeRO-3: this rank's part, and the units it holds gathered.
    if (layout.zero == 3)
      memory.parameters = 4 * (p / layout.dp + std::min(p, static_cast<double>(model.zero3_gathered)));
    memory.optimizer = optimizer_bytes_per_parameter(request.optimizer) * p / sharded;
    if (layout.dp == 1 || layout.tp > 1 || layout.pp > 1) {
      // One device or the mesh: every micro-batch's gradients are a leaf of the tree; under
      // ZeRO-1 the replicas' sum is reduce-scattered into a shard.
      memory.gradients = 4 * p * (1 + pending_sums(k)) + (layout.zero == 1 ? 4 * p / layout.dp : 0);
    } else {
      const double copies = 4 * p * ddp_gradient_copies(k);
      // ZeRO-2 reduce-scatters the last micro-batch's buckets as backward makes them into the
      // rank's shard, after a full-size sum of the earlier ones.
      const double zero2 = 4 * p / layout.dp + (k > 1 ? 4 * p : std::min(4 * p, kZero2BucketsHeld * kBucketBytes));
      if (shared_weights) {
        // CPU devices of one host (one process each, over shm): the stepped weights, the
        // optimizer state and the reduced gradients are one copy in shared memory for the
        // whole host; a rank keeps its replica's weights and gradients of its own.
        prediction.host_shared_bytes = (8 + optimizer_bytes_per_parameter(request.optimizer)) * p;
        memory.optimizer = 0;
        memory.gradients = copies + (layout.zero == 2 ? zero2 : 0);
      } else if (layout.zero >= 2) {
        memory.gradients = copies + zero2;
      } else {
        // The step's buffer, and ZeRO-1's reduced shard.
        memory.gradients = 4 * p + copies + (layout.zero == 1 ? 4 * p / layout.dp : 0);
      }
    }
    const int64_t in_flight = parallel::most_in_flight(parallel::pipeline_ops(layout.schedule, stage, layout.pp, k));
    const double blocks = static_cast<double>(share.blocks);
    const bool holds_rest = !model.transformer || share.last;
    const ActivationBytes& bytes = layout.checkpoint_activations ? model.checkpointed : model.activations;
    const double head = bytes.rest_kept - bytes.first_kept;
    const double kept = blocks * bytes.block_kept * tp_share + (share.first ? bytes.first_kept : 0) +
                        (holds_rest ? head / layout.tp : 0);
    const double transient = (holds_rest ? bytes.last_transient : bytes.other_transient) * tp_share;
    memory.activations = (static_cast<double>(in_flight) * kept + transient) * m;
    memory.workspace = model.workspace_bytes;
    prediction.stage_memory.push_back(memory.total());
    if (memory.total() > prediction.memory.total()) {
      prediction.memory = memory;
      prediction.largest_stage = stage;
    }

    SampleCost stage_cost;
    stage_cost.seconds = blocks * model.block.seconds * (layout.checkpoint_activations ? 4.0 / 3.0 : 1.0) +
                         (holds_rest ? model.base.seconds : 0);
    stage_cost.flops = blocks * model.block.flops * (layout.checkpoint_activations ? 4.0 / 3.0 : 1.0) +
                       (holds_rest ? model.base.flops : 0);
    double micro_batch = compute_seconds(stage_cost, m, machine, layout.precision) / layout.tp;
    if (machine.cpu_devices) micro_batch += model.micro_batch_seconds / machine.core_share;
    micro_batch += machine.kernel_launch_seconds * (blocks * kKernelsPerBlock + (holds_rest ? kKernelsRest : 0));
    slowest_micro_batch = std::max(slowest_micro_batch, micro_batch);
  }

  TimeBreakdown& time = prediction.time;
  time.compute = static_cast<double>(k) * slowest_micro_batch;
  time.bubble = static_cast<double>(layout.pp - 1) * slowest_micro_batch;
  // The optimizer reads and writes weights, gradients and its state: about 32 bytes per
  // element it steps for AdamW, 16 for SGD.
  const double step_bytes = (request.optimizer == "adamw" ? 32.0 : 16.0) * largest_trained / sharded;
  time.optimizer = machine.memory_bandwidth > 0 ? step_bytes / machine.memory_bandwidth : 0;

  const double activation_bytes = m * static_cast<double>(model.gpt.context * model.gpt.width) * 4;
  double communication = 0;
  if (layout.tp > 1) {
    // Two all-reduces of a micro-batch's activations per block forward, two backward.
    const DeviceShare share = model.share(layout.tp, layout.pp, 0);
    communication += static_cast<double>(k) * 4 * static_cast<double>(share.blocks) *
                     all_reduce_seconds(activation_bytes, layout.tp, machine);
  }
  if (layout.pp > 1) {
    // Each micro-batch's activations forward and their gradients back across a boundary.
    communication += static_cast<double>(k + layout.pp - 1) * 2 *
                     (machine.collective_latency_seconds + activation_bytes / machine.bus_bandwidth);
  }
  if (layout.dp > 1) {
    const double reduce = all_reduce_seconds(4 * largest_trained, layout.dp, machine);
    // On GPUs the buckets reduce while the last micro-batch's backward (2/3 of it) runs; CPU
    // devices run the copies on the cores that compute, so nothing overlaps.
    const double overlap = machine.cpu_devices ? 0 : slowest_micro_batch * 2.0 / 3.0;
    communication += std::max(reduce - overlap, reduce * kBucketBytes / std::max(4 * largest_trained, kBucketBytes));
    if (layout.zero == 3) {
      // Every micro-batch all-gathers the weights for its forward and again for its backward,
      // where ZeRO-1 and 2 gather them once after the step: 2k - 1 more all-gathers, each
      // half an all-reduce's traffic. On GPUs the prefetch hides them behind the compute.
      const double gathers = static_cast<double>(2 * k - 1) * reduce / 2;
      const double hidden = machine.cpu_devices ? 0 : time.compute;
      communication += std::max(gathers - hidden, gathers * kBucketBytes / std::max(4 * largest_trained, kBucketBytes));
    }
  }
  time.communication = communication;

  // CPU devices' share of what their processes hold in common comes out of the same memory.
  const double needed = prediction.memory.total() + prediction.host_shared_bytes / machine.devices;
  prediction.fits = needed <= machine.memory_bytes && std::isfinite(time.total());
  if (!std::isfinite(time.total())) {
    prediction.why_not = "the devices have no " + layout.precision + " matrix units";
  } else if (!prediction.fits) {
    prediction.why_not = "needs " + memory_text(needed) + " on " +
                         (layout.pp > 1 ? "stage " + std::to_string(prediction.largest_stage) + "'s device"
                                        : std::string("each device")) +
                         ", which has " + memory_text(machine.memory_bytes);
  }
  prediction.samples_per_second = static_cast<double>(request.batch) / time.total();
  return prediction;
}

std::vector<LayoutPrediction> plan_layouts(const ModelFacts& model, const MachineProfile& machine,
                                           const PlanRequest& request) {
  std::vector<LayoutPrediction> predictions;
  for (const LayoutChoice& layout : candidate_layouts(model, request)) {
    predictions.push_back(predict_layout(model, machine, request, layout));
  }
  std::stable_sort(predictions.begin(), predictions.end(), [](const LayoutPrediction& a, const LayoutPrediction& b) {
    if (a.fits != b.fits) return a.fits;
    // Throughputs within rounding of each other rank by memory: the smaller layout wins.
    const auto rounded = [](double rate) { return std::round(std::log(rate) * 200); };  // steps of 0.5%
    if (a.fits && rounded(a.samples_per_second) != rounded(b.samples_per_second)) {
      return a.samples_per_second > b.samples_per_second;
    }
    return a.memory.total() < b.memory.total();
  });
  return predictions;
}

}  // namespace lockstep::tools
