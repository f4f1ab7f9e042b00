// `lockstep plan`: which layouts of a model fit a machine's devices, and how fast each
// would train. The model is built and measured here (model_facts.h), the machine is a
// profile (machine_profile.h), the arithmetic is layout_prediction.h's; this file reads the
// flags and prints the ranking, or one JSON object per layout.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/core/device.h"
#include "lockstep/core/error.h"
#include "lockstep/nn/models.h"
#include "tools/common/commands.h"
#include "tools/common/flags.h"
#include "tools/common/gpt_shape.h"
#include "tools/plan/layout_prediction.h"
#include "tools/plan/machine_profile.h"
#include "tools/plan/model_facts.h"

namespace lockstep::tools {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

struct PlanOptions {
  std::string model = "gpt";
  std::string preset = "gpt2-124m";
  int64_t layers = 0, heads = 0, width = 0, context = 0, vocab = 0;
  int64_t batch_size = 512;
  int64_t devices = 0;  // 0: the machine's
  std::string machine = "this-host";
  std::string optimizer = "adamw";
  std::string precision = "f32";
  int64_t micro_batch = 0;
  // Restrict to one layout's axes (0: any): "would this fit, and if not, what does?"
  int64_t dp = 0, tp = 0, pp = 0, zero = -1;
  int64_t top = 12;
  bool json = false;
};

nn::GptConfig gpt_config(const PlanOptions& o) {
  if (o.vocab < 0) throw UsageError("--vocab must be positive, got " + std::to_string(o.vocab));
  nn::GptConfig config =
      gpt_shape({.preset = o.preset, .layers = o.layers, .heads = o.heads, .width = o.width, .context = o.context});
  if (o.vocab > 0) config.vocab = o.vocab;
  return config;
}

MachineProfile machine_for(const PlanOptions& o) {
  if (o.machine == "this-host") return this_host_profile(o.devices > 0 ? static_cast<int>(o.devices) : 2);
  if (o.machine.find('/') != std::string::npos || o.machine.ends_with(".json")) {
    std::ifstream in(o.machine);
    if (!in) throw UsageError("--machine " + o.machine + ": cannot read it (a `lockstep doctor --json` report)");
    nlohmann::json report;
    try {
      in >> report;
    } catch (const std::exception& e) {
      throw UsageError("--machine " + o.machine + ": not JSON: " + e.what());
    }
    return machine_profile_from_doctor(report, o.machine);
  }
  return named_machine_profile(o.machine);
}

bool wanted(const PlanOptions& o, const LayoutChoice& l) {
  return (o.dp == 0 || l.dp == o.dp) && (o.tp == 0 || l.tp == o.tp) && (o.pp == 0 || l.pp == o.pp) &&
         (o.zero < 0 || l.zero == o.zero);
}

// The table's memory columns: GiB, or MiB where every figure is below one GiB.
struct MemoryUnit {
  const char* name;
  double bytes;
  std::string operator()(double value) const {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f", value / bytes);
    return text;
  }
};

nlohmann::json prediction_json(const LayoutPrediction& p) {
  const LayoutChoice& l = p.layout;
  return {{"layout", l.name()},
          {"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"zero", l.zero},
          {"schedule", l.pp > 1 ? parallel::pipeline_schedule_name(l.schedule) : "none"},
          {"micro_batch", l.micro_batch},
          {"checkpoint_activations", l.checkpoint_activations},
          {"precision", l.precision},
          {"memory_bytes", p.memory.total()},
          {"memory",
           {{"parameters", p.memory.parameters},
            {"gradients", p.memory.gradients},
            {"optimizer", p.memory.optimizer},
            {"activations", p.memory.activations},
            {"workspace", p.memory.workspace}}},
          {"host_shared_bytes", p.host_shared_bytes},
          {"largest_stage", p.largest_stage},
          {"stage_memory_bytes", p.stage_memory},
          {"fits", p.fits},
          {"why_not", p.why_not},
          {"step_seconds", p.time.total()},
          {"time",
           {{"compute", p.time.compute},
            {"optimizer", p.time.optimizer},
            {"communication", p.time.communication},
            {"bubble", p.time.bubble}}},
          {"samples_per_second", p.samples_per_second},
          {"train_flags", l.train_flags()},
          {"launcher", l.launcher()}};
}

void print_row(const LayoutPrediction& p, int rank, const MemoryUnit& unit) {
  const MemoryBreakdown& m = p.memory;
  const TimeBreakdown& t = p.time;
  std::printf("%4d  %-44s %8s  %7s %7s %7s %7s %7s  %8.3f %8.3f %8.3f %8.3f %9.1f\n", rank, p.layout.name().c_str(),
              unit(m.total()).c_str(), unit(m.parameters).c_str(), unit(m.gradients).c_str(), unit(m.optimizer).c_str(),
              unit(m.activations).c_str(), unit(m.workspace).c_str(), t.total(), t.compute + t.optimizer,
              t.communication, t.bubble, p.samples_per_second);
}

}  // namespace

int plan_main(const std::vector<std::string>& args) {
  PlanOptions o;
  Flags flags("lockstep plan",
              "Which layouts of a model fit the devices of a machine, each with its predicted peak memory per device "
              "(parameters, gradients, optimizer state, activations, workspace) and step time (compute, exposed "
              "communication, pipeline bubble), ranked by samples/s. The model is built and run here on one and two "
              "samples to measure its activations: under a second for the small presets, about a minute for GPT-2 124M "
              "with its 50304-token vocabulary on two cores.");
  flags.add("model", &o.model, "gpt, or cnn, mlp, resnet (Fashion-MNIST)");
  flags.add("preset", &o.preset, "gpt's shape: tiny, small or gpt2-124m");
  flags.add("layers", &o.layers, "gpt: transformer blocks (default: the preset's)");
  flags.add("heads", &o.heads, "gpt: attention heads (default: the preset's)");
  flags.add("width", &o.width, "gpt: embedding width (default: the preset's)");
  flags.add("context", &o.context, "gpt: tokens per window (default: the preset's)");
  flags.add("vocab", &o.vocab,
            "gpt: tokens in the vocabulary (default 256, the bytes `lockstep train` reads; GPT-2's is 50257, "
            "padded to 50304 by llm.c)");
  flags.add("batch-size", &o.batch_size, "samples per step, over all devices");
  flags.add("devices", &o.devices, "devices to plan for (default: the machine's; this-host: 2)");
  flags.add("machine", &o.machine,
            "this-host (CPU devices, measured now), a100-80g-8x, h100-sxm-8x, h200-8x, t4-4x-pcie, rtx4090-2x-pcie, "
            "or a `lockstep doctor --json` report from the server");
  flags.add("optimizer", &o.optimizer, "adamw, sgd (with momentum) or sgd-plain");
  flags.add("precision", &o.precision, "f32, or bf16 / f16 matrix products with f32 weights");
  flags.add("micro-batch", &o.micro_batch, "only this micro-batch (0: every one that divides a replica's share)");
  flags.add("dp", &o.dp, "only layouts with this many data-parallel replicas (0: any)");
  flags.add("tp", &o.tp, "only layouts with this tensor-parallel size (0: any)");
  flags.add("pp", &o.pp, "only layouts with this many pipeline stages (0: any)");
  flags.add("zero", &o.zero, "only this ZeRO stage, 0-3 (-1: any)");
  flags.add("top", &o.top, "layouts to list that fit (0: all)");
  flags.add_switch("json", &o.json, "one JSON object per layout, one per line, fitting ones first");
  if (!flags.parse(args)) return 0;
  if (o.optimizer != "adamw" && o.optimizer != "sgd" && o.optimizer != "sgd-plain") {
    throw UsageError("--optimizer must be adamw, sgd or sgd-plain, got '" + o.optimizer + "'");
  }
  if (o.precision != "f32" && o.precision != "bf16" && o.precision != "f16") {
    throw UsageError("--precision must be f32, bf16 or f16, got '" + o.precision + "'");
  }
  if (o.devices < 0) throw UsageError("--devices must be positive, got " + std::to_string(o.devices));

  MachineProfile machine = machine_for(o);
  if (o.devices > 0) machine.devices = static_cast<int>(o.devices);
  const PlanRequest request{.batch = o.batch_size,
                            .devices = machine.devices,
                            .optimizer = o.optimizer,
                            .precision = o.precision,
                            .micro_batch = o.micro_batch};
  // This host's devices are timed on a device's threads; for GPUs only bytes are measured,
  // on every core.
  const int threads = machine.cpu_devices ? machine.threads_per_device : host_cores();
  ModelFacts model;
  if (o.model == "gpt") {
    model = gpt_model_facts(gpt_config(o), o.precision, threads, machine.cpu_devices);
  } else {
    const std::vector<std::string> images = nn::model_names();
    if (std::find(images.begin(), images.end(), o.model) == images.end()) {
      throw UsageError("--model must be gpt, cnn, mlp or resnet, got '" + o.model + "'");
    }
    // Image models' FLOPs are not counted: their seconds measured here at this host's GEMM
    // rate stand in for them on GPUs.
    model = image_model_facts(o.model, o.precision, threads, true);
    if (!machine.cpu_devices) {
      const MachineProfile host = this_host_profile(1);
      model.base.flops = model.base.seconds * host.fp32_flops;
    }
  }

  std::vector<LayoutPrediction> all = plan_layouts(model, machine, request);
  std::vector<LayoutPrediction> asked;
  for (const LayoutPrediction& p : all) {
    if (wanted(o, p.layout)) asked.push_back(p);
  }
  if (asked.empty()) {
    throw UsageError(
        "plan: no layout of " + std::to_string(machine.devices) +
        " devices has the given --dp/--tp/--pp/"
        "--zero (their product must be the devices; ZeRO-2 and 3 only under pure data parallelism, ZeRO-1 with "
        "several replicas; --tp must "
        "divide the heads and the vocabulary)");
  }

  if (o.json) {
    for (const LayoutPrediction& p : asked) std::printf("%s\n", prediction_json(p).dump().c_str());
    return 0;
  }
  std::printf("plan for %s (%.2fM parameters), batch %lld\n", model.label.c_str(), model.parameters / 1e6,
              static_cast<long long>(o.batch_size));
  std::printf("machine: %s, %s per device, %s\n  figures: %s\n", machine.description.c_str(),
              memory_text(machine.memory_bytes).c_str(), o.optimizer.c_str(), machine.source.c_str());
  std::printf("model measured on this host in %.1f s\n\n", model.measure_seconds);
  double largest = 0;
  for (const LayoutPrediction& p : asked) largest = std::max(largest, p.fits ? p.memory.total() : 0.0);
  const MemoryUnit unit = largest < kGiB ? MemoryUnit{"MiB", kMiB} : MemoryUnit{"GiB", kGiB};
  int fitting = 0;
  if (std::any_of(asked.begin(), asked.end(), [](const LayoutPrediction& p) { return p.fits; })) {
    std::printf("%4s  %-44s %8s  %7s %7s %7s %7s %7s  %8s %8s %8s %8s %9s\n", "rank", "layout", unit.name, "param",
                "grad", "optim", "activ", "work", "step s", "compute", "comm", "bubble", "samples/s");
  }
  for (const LayoutPrediction& p : asked) {
    if (!p.fits) continue;
    ++fitting;
    if (o.top == 0 || fitting <= o.top) print_row(p, fitting, unit);
  }
  if (o.top > 0 && fitting > o.top)
    std::printf("      ... %d more that fit (--top 0 lists them)\n", fitting - static_cast<int>(o.top));
  const size_t others = asked.size() - static_cast<size_t>(fitting);
  if (others > 0) {
    std::printf("\n%zu layout%s do%s not fit:\n", others, others == 1 ? "" : "s", others == 1 ? "es" : "");
    size_t shown = 0;
    for (const LayoutPrediction& p : asked) {
      if (p.fits) continue;
      if (++shown > 8) {
        std::printf("  ... %zu more\n", others - 8);
        break;
      }
      std::printf("  %-44s %s\n", p.layout.name().c_str(), p.why_not.c_str());
    }
  }
  const auto best = std::find_if(all.begin(), all.end(), [](const LayoutPrediction& p) { return p.fits; });
  if (fitting == 0) {
    if (best == all.end()) {
      // all is ordered by memory here: the first needs the least.
      std::printf("\nnothing fits: %s (%s)%s\n", all.front().why_not.c_str(), all.front().layout.name().c_str(),
                  all.front().why_not.starts_with("needs") ? "; use more devices, a smaller model or batch" : "");
      return 1;
    }
    std::printf("\nwhat fits instead: %s (%s per device, %.1f samples/s)\n", best->layout.name().c_str(),
                memory_text(best->memory.total()).c_str(), best->samples_per_second);
  }
  if (best != all.end()) {
    const LayoutPrediction& run = fitting > 0 ? asked.front() : *best;
    std::string shape;
    if (o.model == "gpt") {
      shape = " --preset " + o.preset;
      // The shape flags given, for train to build the same model (train has no --vocab).
      for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"layers", o.layers},
                                        {"heads", o.heads},
                                        {"width", o.width},
                                        {"context", o.context}}) {
        if (flags.given(flag)) shape += std::string(" --") + flag + " " + std::to_string(value);
      }
    }
    std::printf("\nrun it: %slockstep train --model %s%s --batch-size %lld %s\n", run.layout.launcher().c_str(),
                o.model.c_str(), shape.c_str(), static_cast<long long>(o.batch_size), run.layout.train_flags().c_str());
  }
  return fitting > 0 ? 0 : 1;
}

}  // namespace lockstep::tools
