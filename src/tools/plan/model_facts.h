// What a plan knows about a model, taken from the code that builds and runs it: the
// parameters each device of a layout trains (its pipeline stage's layers, cut for its
// tensor-parallel group, as the mesh builds them), and per sample the activation bytes a
// micro-batch keeps for backward and its forward-and-backward time, measured by running
// the model on this host on one and two samples (a GPT: one and two blocks, so a block's
// share and the rest's come apart) and scaled.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>

#include "lockstep/nn/gpt.h"

namespace lockstep::tools {

// One device's part of the model in a tp x pp layout.
struct DeviceShare {
  int64_t trained = 0;  // parameter elements it trains
  int64_t copied = 0;   // elements it holds that it does not train (a last stage's copy of the tied head)
  int64_t blocks = 0;   // transformer blocks on it (the GPT)
  bool first = true, last = true;
};

// Per sample of a micro-batch: forward-and-backward seconds on one device of this host, and FLOPs.
struct SampleCost {
  double seconds = 0, flops = 0;
};

// Per sample of a micro-batch, activation bytes: what forward keeps for backward, per block
// and for the rest (embeddings, final norm, head, loss), and what backward allocates on top
// while it runs, once per device (the last stage's includes the head's, a checkpointed
// model's the recomputed block).
struct ActivationBytes {
  double block_kept = 0, rest_kept = 0;
  double first_kept = 0;  // of rest_kept, the first stage's (the embeddings); the last stage holds the rest
  double last_transient = 0, other_transient = 0;
};

struct ModelFacts {
  std::string label;
  int64_t parameters = 0;
  bool transformer = false;  // tensor, pipeline and checkpointed layouts exist (the GPT)
  nn::GptConfig gpt;
  // The whole model for image models; for the GPT, the rest (embeddings, final norm, head, loss).
  SampleCost base;
  SampleCost block;  // one transformer block
  ActivationBytes activations, checkpointed;
  // ZeRO-3: the most parameter elements a rank holds gathered at once (whole, beside its
  // shards): the parameters outside every unit and two units, as `lockstep train` cuts them.
  int64_t zero3_gathered = 0;
  double workspace_bytes = 0;      // what a micro-batch needs whatever its size
  double micro_batch_seconds = 0;  // on this host, what a micro-batch costs whatever its size
  double measure_seconds = 0;      // how long measuring took
  // The share of the device at (tensor-parallel size, pipeline size, stage); the stages it
  // comes from are built on first use of a tensor-parallel size and remembered.
  std::function<DeviceShare(int tp, int pp, int stage)> share;
};

// precision: "f32", "bf16" or "f16" (the measured runs run under that autocast);
// threads: a device's threads, as the layouts will run it; timed: measure the seconds too
// (CPU devices of this host; GPUs' time comes from FLOPs, and one probe of one sample per
// model gives the bytes).
ModelFacts gpt_model_facts(const nn::GptConfig& config, const std::string& precision, int threads, bool timed);
ModelFacts image_model_facts(const std::string& model, const std::string& precision, int threads, bool timed);

}  // namespace lockstep::tools
