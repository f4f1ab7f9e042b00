// Memory per device of a GPT-2 124M-shaped model (nn::gpt_preset("gpt2-124m"): GPT-2
// small's shape with a byte vocabulary) on each device-mesh layout and under
// DistributedDataParallel with ZeRO, beside the arithmetic of fp32 training with AdamW: 4
// bytes of weight, 4 of gradient and 8 of AdamW moments (m, v) per parameter, each device
// paying for the parameters and the shards its layout gives it. The model is built and
// stepped, not trained: each layout's ranks run as threads, each on a CPU device of its own
// (memory_stats(cpu:r) is rank r's memory; ZeRO's ranks keep weights of their own, as GPU
// ranks do), and take two optimizer steps on one sample per replica (micro-batch 1). The
// first step creates the AdamW state; the second is a step as every later one is.
//
// Per device it prints the parameters it trains and, each beside its formula (the table's
// legend gives them per layout; the mesh's are these):
//   built   allocated after construction                          4 B/param
//   kept    allocated between steps (gradients are dropped)       12 B/param: weights, m, v
//   peak1   the most allocated during the first step              16 B/param
//   peak2   the most allocated during the second step             16 B/param
// The mesh under ZeRO-1 (zero1 beside tp or pp, e.g. zero1dp2pp2) keeps 1/D of m and v on
// each of a data-parallel group's D ranks: built 4, kept 4 + 8/D, peak 8 + 12/D (the
// gradients and this rank's reduce-scattered shard of them).
// A last pipeline stage that is not also the first holds a copy of the head's tied weight,
// which is no parameter (the first stage trains it and sends it over): every formula adds
// 4 B per element of it there. The peaks also hold activations and transient copies of the
// gradients, which the formula leaves out; a short --context keeps the activations small.
//
//   build/bin/gpt_layout_memory [--context 64]
//       [--layouts 1,dp2,tp2,pp2,tp2pp2,dp2tp2pp2,ddp2,zero1dp2,zero2dp2,zero3dp2,zero1dp4,zero2dp4,
//                  zero3dp4,zero2dp8,zero3dp8,dp2pp2,zero1dp2pp2,dp2tp2,zero1dp2tp2]
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/comm/local_communicator.h"
#include "lockstep/core/allocator.h"
#include "lockstep/core/device.h"
#include "lockstep/core/parallel.h"
#include "lockstep/core/philox.h"
#include "lockstep/nn/gpt.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/parallel/distributed_data_parallel.h"
#include "lockstep/parallel/gpt_mesh.h"
#include "lockstep/parallel/loss_function.h"
#include "tools/common/flags.h"

namespace lockstep {
namespace {

using parallel::GptMeshOptions;
using parallel::GptMeshRank;
using parallel::MeshShape;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kSeed = 7;
constexpr double kMiB = 1024.0 * 1024.0;

struct Options {
  std::string preset = "gpt2-124m";
  int64_t context = 64;
  std::string layouts =
      "1,dp2,tp2,pp2,tp2pp2,dp2tp2pp2,ddp2,zero1dp2,zero2dp2,zero3dp2,zero1dp4,zero2dp4,zero3dp4,zero2dp8,"
      "zero3dp8,dp2pp2,zero1dp2pp2,dp2tp2,zero1dp2tp2";
};

// A layout to measure: the mesh's shape (under ZeRO-1 where mesh_zero is 1), or under
// DistributedDataParallel (zero_stage >= 0) shape.dp ranks.
struct Requested {
  MeshShape shape;
  int zero_stage = -1;
  int mesh_zero = 0;
};

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> parts;
  std::stringstream in(list);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

// "1" is one device; otherwise "dp<D>", "tp<T>", "pp<P>" in any order and combination,
// e.g. "tp2pp2".
MeshShape parse_layout(const std::string& name) {
  MeshShape shape;
  if (name == "1") return shape;
  size_t i = 0;
  while (i < name.size()) {
    const std::string axis = name.substr(i, 2);
    i += 2;
    size_t digits = 0;
    while (i + digits < name.size() && std::isdigit(static_cast<unsigned char>(name[i + digits]))) ++digits;
    if (digits == 0) throw std::invalid_argument(name);
    const int size = std::stoi(name.substr(i, digits));
    i += digits;
    if (axis == "dp") {
      shape.dp = size;
    } else if (axis == "tp") {
      shape.tp = size;
    } else if (axis == "pp") {
      shape.pp = size;
    } else {
      throw std::invalid_argument(name);
    }
  }
  return shape;
}

std::string layout_label(const MeshShape& shape) {
  if (shape.size() == 1) return "one device";
  std::string label;
  const auto add = [&](const char* axis, int size) {
    if (size == 1) return;
    if (!label.empty()) label += " x ";
    label += axis;
    label += std::to_string(size);
  };
  add("dp ", shape.dp);
  add("tp ", shape.tp);
  add("pp ", shape.pp);
  return label;
}

std::unique_ptr<optim::Optimizer> adamw(std::vector<Tensor> params) {
  return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = 3e-4, .weight_decay = 0.1});
}

// Runs body(rank) on one thread per rank, one compute thread each; rethrows the first error.
void on_rank_threads(int ranks, const std::function<void(int)>& body) {
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      set_num_threads(1);
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    if (!errors[static_cast<size_t>(r)].empty()) {
      std::string message = "rank ";
      message += std::to_string(r);
      message += ": ";
      message += errors[static_cast<size_t>(r)];
      throw std::runtime_error(message);
    }
  }
}

// What the device holds: its blocks, the embeddings (first stage), the head's copy of the
// tied weight (a last stage that is not the first).
std::string holds(const parallel::GptStagePlan& plan, bool head_copy) {
  std::string text = "h.";
  text += std::to_string(plan.first_block);
  text += '-';
  text += std::to_string(plan.end_block - 1);
  if (plan.stage == 0) text += " +emb";
  if (head_copy) text += " +head copy";
  return text;
}

struct RankMemory {
  std::string holds;       // what the device holds of the model
  int64_t params = 0;      // elements of the parameters it trains
  int64_t built = 0;       // bytes allocated after construction
  int64_t kept = 0;        // ... after the steps
  int64_t first_peak = 0;  // the most allocated during the first step
  int64_t peak = 0;        // ... during the second
  // The formulas' bytes for the same three moments.
  int64_t built_formula = 0, kept_formula = 0, peak_formula = 0;
};

struct LayoutMemory {
  std::string label;
  std::vector<RankMemory> ranks;
  double seconds = 0;
};

int64_t allocated(int device) { return memory_stats(Device::cpu(device)).allocated_bytes; }

// One sample per replica, on the host device: each rank copies its own onto its device.
struct SampleBatch {
  Tensor tokens, targets;
};
SampleBatch sample_batch(const nn::GptConfig& config, int64_t batch, Device host) {
  Philox rng(kSeed, 1);
  std::vector<int64_t> tokens(static_cast<size_t>(batch * config.context)), targets(tokens.size());
  for (int64_t& t : tokens) t = rng.next_u32() % config.vocab;
  for (int64_t& t : targets) t = rng.next_u32() % config.vocab;
  return {Tensor::from_vector(tokens, {batch, config.context}, host),
          Tensor::from_vector(targets, {batch, config.context}, host)};
}

// Two steps of every rank (step(rank, step index) on its thread), each rank's peak measured
// during each; then what the ranks keep.
void measure_steps(LayoutMemory& layout, const std::vector<int64_t>& before,
                   const std::function<void(int, uint64_t)>& step) {
  const int ranks = static_cast<int>(layout.ranks.size());
  for (uint64_t s = 0; s < 2; ++s) {
    for (int r = 0; r < ranks; ++r) reset_peak_memory_stats(Device::cpu(r));
    on_rank_threads(ranks, [&](int r) { step(r, s); });
    for (int r = 0; r < ranks; ++r) {
      RankMemory& m = layout.ranks[static_cast<size_t>(r)];
      const int64_t peak = memory_stats(Device::cpu(r)).peak_allocated_bytes - before[static_cast<size_t>(r)];
      (s == 0 ? m.first_peak : m.peak) = peak;
    }
  }
  for (int r = 0; r < ranks; ++r) {
    layout.ranks[static_cast<size_t>(r)].kept = allocated(r) - before[static_cast<size_t>(r)];
  }
}

// After the ranks are gone: their devices hold nothing, and start the next layout from
// fresh memory.
void release_devices(int ranks, const std::vector<int64_t>& before) {
  for (int r = 0; r < ranks; ++r) {
    const int64_t left = allocated(r) - before[static_cast<size_t>(r)];
    if (left != 0) {
      std::fprintf(stderr, "warning: cpu:%d holds %lld bytes after the ranks are gone\n", r,
                   static_cast<long long>(left));
    }
    empty_cache(Device::cpu(r));
  }
}

std::vector<int64_t> allocated_on_ranks(int ranks) {
  std::vector<int64_t> bytes(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) bytes[static_cast<size_t>(r)] = allocated(r);
  return bytes;
}

// Builds the layout's ranks from `full` (which lives on `host`, a device no rank uses),
// measures, steps twice, measures again.
LayoutMemory measure_layout(const nn::Gpt& full, const MeshShape& shape, int zero_stage, Device host) {
  const Clock::time_point start = Clock::now();
  const int ranks = shape.size();
  LayoutMemory layout;
  layout.label = zero_stage == 1 ? std::string("zero1 ") + layout_label(shape) : layout_label(shape);
  layout.ranks.resize(static_cast<size_t>(ranks));
  const std::vector<int64_t> before = allocated_on_ranks(ranks);

  GptMeshOptions options;
  options.mesh = shape;
  options.micro_batch = 1;
  options.zero_stage = zero_stage;
  const auto comms = comm::LocalCommunicator::create_group(ranks);
  std::vector<std::unique_ptr<GptMeshRank>> parts(static_cast<size_t>(ranks));
  on_rank_threads(ranks, [&](int r) {
    parts[static_cast<size_t>(r)] =
        std::make_unique<GptMeshRank>(full, options, comms[static_cast<size_t>(r)], Device::cpu(r), adamw);
  });
  for (int r = 0; r < ranks; ++r) {
    RankMemory& m = layout.ranks[static_cast<size_t>(r)];
    const parallel::GptStage& stage = parts[static_cast<size_t>(r)]->stage();
    for (const Tensor& p : stage.parameters()) m.params += p.numel();
    const int64_t head_copy = stage.last() && !stage.first() ? stage.head_weight.numel() : 0;
    m.holds = holds(stage.plan, head_copy > 0);
    m.built_formula = 4 * m.params + 4 * head_copy;
    if (zero_stage == 1) {
      // AdamW's m and v cut across the data-parallel group; during a step the gradients and
      // this rank's reduce-scattered shard of them.
      m.holds += " mv/";
      m.holds += std::to_string(shape.dp);
      const int64_t shard = m.params / shape.dp;
      m.kept_formula = 4 * m.params + 8 * shard + 4 * head_copy;
      m.peak_formula = 8 * m.params + 12 * shard + 4 * head_copy;
    } else {
      m.kept_formula = 12 * m.params + 4 * head_copy;
      m.peak_formula = 16 * m.params + 4 * head_copy;
    }
    m.built = allocated(r) - before[static_cast<size_t>(r)];
  }

  const SampleBatch batch = sample_batch(full.config, shape.dp, host);
  measure_steps(layout, before, [&](int r, uint64_t step) {
    parts[static_cast<size_t>(r)]->step(batch.tokens, batch.targets, static_cast<int64_t>(step) * shape.dp, step,
                                        kSeed);
  });
  parts.clear();
  release_devices(ranks, before);
  layout.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return layout;
}

// DistributedDataParallel over the whole GPT on `ranks` threads under ZeRO stage `stage`
// (0: plain ddp), each rank keeping weights of its own on its device, as GPU ranks do.
LayoutMemory measure_zero_layout(const nn::Gpt& full, int ranks, int stage, Device host) {
  const Clock::time_point start = Clock::now();
  LayoutMemory layout;
  layout.label = (stage == 0 ? std::string("ddp ") : "zero" + std::to_string(stage) + " dp ") + std::to_string(ranks);
  layout.ranks.resize(static_cast<size_t>(ranks));
  const std::vector<int64_t> before = allocated_on_ranks(ranks);

  // A Gpt is built on cpu:0: here, one at a time, each then moved to its rank's device.
  std::vector<std::shared_ptr<nn::Gpt>> models;
  for (int r = 0; r < ranks; ++r) {
    models.push_back(std::make_shared<nn::Gpt>(full.config, kSeed));
    models.back()->to(Device::cpu(r));
  }
  const auto comms = comm::LocalCommunicator::create_group(ranks);
  std::vector<std::unique_ptr<parallel::DistributedDataParallel>> replicas(static_cast<size_t>(ranks));
  on_rank_threads(ranks, [&](int r) {
    replicas[static_cast<size_t>(r)] = std::make_unique<parallel::DistributedDataParallel>(
        models[static_cast<size_t>(r)], adamw, comms[static_cast<size_t>(r)],
        parallel::DistributedDataParallelOptions{.loss = parallel::next_token_loss(),
                                                 .micro_batch = 1,
                                                 .zero_stage = stage,
                                                 .zero3_unit_types = {"GptBlock"},
                                                 .share_weights = false});
  });
  const int64_t params = models.front()->num_parameters(), shard = params / ranks;
  // ZeRO-3 gathers two blocks at a time besides the embeddings and the final norm.
  const int64_t block = models.front()->h.front()->num_parameters();
  const int64_t gathered = params - full.config.layers * block + 2 * block;
  for (int r = 0; r < ranks; ++r) {
    RankMemory& m = layout.ranks[static_cast<size_t>(r)];
    m.params = params;
    m.holds = "h.0-" + std::to_string(full.config.layers - 1) + " +emb";
    if (stage > 0) m.holds += stage == 1 ? " mv/" : stage == 2 ? " mvg/" : " wmvg/";
    if (stage > 0) m.holds += std::to_string(ranks);
    // Weights (stage 3: this rank's part), and (below stage 2) the buffer every step's
    // gradients are reduced in.
    m.built_formula = stage == 3 ? 4 * shard : (stage < 2 ? 8 : 4) * params;
    m.kept_formula = stage == 0 ? 16 * params : m.built_formula + 8 * shard;
    m.peak_formula = stage == 0 ? 16 * params : m.built_formula + 12 * shard + (stage == 3 ? 4 * gathered : 0);
    m.built = allocated(r) - before[static_cast<size_t>(r)];
  }

  const SampleBatch batch = sample_batch(full.config, ranks, host);
  const TensorBatch global{{"input", batch.tokens}, {"target", batch.targets}};
  measure_steps(layout, before, [&](int r, uint64_t step) {
    replicas[static_cast<size_t>(r)]->step(
        global, {.seed = kSeed, .step = step, .first_sample = static_cast<int64_t>(step) * ranks});
  });
  replicas.clear();
  models.clear();
  release_devices(ranks, before);
  layout.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return layout;
}

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", static_cast<double>(bytes) / kMiB);
  return text;
}

std::string ratio(int64_t measured, int64_t formula) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", static_cast<double>(measured) / static_cast<double>(formula));
  return text;
}

std::string millions(int64_t n) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2fM", static_cast<double>(n) / 1e6);
  return text;
}

std::string kib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%+.0f", static_cast<double>(bytes) / 1024.0);
  return text;
}

void print_table(const std::vector<LayoutMemory>& layouts) {
  const char* row = "%-18s %-6s %-18s %7s | %6s %6s | %6s %6s %6s %6s | %6s %6s %6s %6s %6s\n";
  std::printf("\n");
  std::printf(row, "layout", "device", "holds", "params", "built", "formula", "kept", "formula", "ratio", "over",
              "formula", "peak1", "ratio", "peak2", "ratio");
  std::printf(row, "", "", "", "", "MiB", "MiB", "MiB", "MiB", "", "KiB", "MiB", "MiB", "", "MiB", "");
  for (const LayoutMemory& layout : layouts) {
    for (size_t r = 0; r < layout.ranks.size(); ++r) {
      const RankMemory& m = layout.ranks[r];
      std::string device = "cpu:";
      device += std::to_string(r);
      std::printf(row, r == 0 ? layout.label.c_str() : "", device.c_str(), m.holds.c_str(), millions(m.params).c_str(),
                  mib(m.built).c_str(), mib(m.built_formula).c_str(), mib(m.kept).c_str(), mib(m.kept_formula).c_str(),
                  ratio(m.kept, m.kept_formula).c_str(), kib(m.kept - m.kept_formula).c_str(),
                  mib(m.peak_formula).c_str(), mib(m.first_peak).c_str(), ratio(m.first_peak, m.peak_formula).c_str(),
                  mib(m.peak).c_str(), ratio(m.peak, m.peak_formula).c_str());
    }
  }
  std::printf(
      "\nformulas, in bytes per parameter the device trains (fp32, AdamW):\n"
      "  mesh layouts   built 4 (weights), kept 12 (and AdamW's m and v), peak 16 (and the gradients), plus\n"
      "                 4 B per element of the tied weight's copy on a last stage that is not the first\n"
      "  zero1 mesh     built 4, kept 4 + 8/D (m and v sharded across the D replicas of a stage and shard),\n"
      "                 peak 8 + 12/D (the gradients and this rank's reduced shard), plus the tied copy\n"
      "  ddp            built 8 (weights, the reduced-gradient buffer), kept and peak 16\n"
      "  zero1          built 8, kept 8 + 8/N (m and v sharded), peak 8 + 12/N (and this rank's reduced shard)\n"
      "  zero2          built 4, kept 4 + 8/N, peak 4 + 12/N (the reduced gradients sharded too), plus the\n"
      "                 buckets in flight\n"
      "  zero3          built 4/N, kept 12/N, peak 16/N (the weights sharded too) and 4 B per parameter\n"
      "                 gathered: the embeddings and final norm, and two blocks; plus the buckets in flight\n"
      "over: kept minus its formula, AdamW's step counts (one scalar, a 64-byte block, per parameter tensor\n"
      "or ZeRO part). peak1 and peak2 hold activations and transient gradient copies besides the formula.\n");
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "gpt_layout_memory: %s\n", message.c_str());
  return 2;
}

int main_checked(int argc, char** argv) {
  Options options;
  tools::Flags flags("gpt_layout_memory",
                     "Memory per device of a GPT-2 124M-shaped model on each layout, beside the formula of fp32 "
                     "AdamW training.");
  flags.add("context", &options.context, "the GPT's context (the preset's is 1024): shorter keeps activations small");
  flags.add("layouts", &options.layouts,
            "comma-separated: 1 (one device) or dp<D>, tp<T>, pp<P> together, e.g. tp2pp2 (the mesh); ddp<D>, "
            "zero1dp<D>, zero2dp<D>, zero3dp<D> (DistributedDataParallel on D ranks); zero1 before a mesh with tp or "
            "pp, e.g. zero1dp2pp2 (the mesh under ZeRO-1)");
  if (!flags.parse(std::vector<std::string>(argv + 1, argv + argc))) return 0;
  std::vector<Requested> requested;
  int most_ranks = 1;
  for (const std::string& name : split(options.layouts)) {
    Requested layout;
    std::string mesh = name;
    if (name.rfind("ddp", 0) == 0) {
      layout.zero_stage = 0;
      mesh = name.substr(1);
    } else if (name.rfind("zero", 0) == 0 && name.size() > 4) {
      layout.zero_stage = name[4] - '0';
      mesh = name.substr(5);
    }
    try {
      layout.shape = parse_layout(mesh);
    } catch (const std::logic_error&) {
      return usage_error("bad layout '" + name + "'");
    }
    const MeshShape& shape = layout.shape;
    if (layout.zero_stage > 0 && (shape.tp > 1 || shape.pp > 1) && mesh.rfind("dp", 0) == 0) {
      // ZeRO beside tensor or pipeline parallelism: the mesh's own, stage 1 only.
      if (layout.zero_stage != 1) {
        return usage_error("bad layout '" + name + "': the mesh shards the optimizer state only (zero1), not zero" +
                           std::to_string(layout.zero_stage));
      }
      layout.mesh_zero = 1;
      layout.zero_stage = -1;
    }
    if (shape.dp < 1 || shape.tp < 1 || shape.pp < 1 || layout.zero_stage > 3 ||
        (layout.zero_stage >= 0 && (shape.tp > 1 || shape.pp > 1 || mesh.rfind("dp", 0) != 0))) {
      return usage_error("bad layout '" + name + "'");
    }
    most_ranks = std::max(most_ranks, shape.size());
    requested.push_back(layout);
  }
  if (requested.empty()) return usage_error("--layouts must name at least one layout");

  nn::GptConfig config = nn::gpt_preset(options.preset);
  config.context = options.context;
  nn::check_gpt_config(config);
  for (const Requested& layout : requested) {
    GptMeshOptions mesh;
    mesh.mesh = layout.shape;
    parallel::gpt_blocks_per_stage(config, mesh);  // an Error where the stages cannot be filled
  }
  // The full model every rank copies its part from lives on a device no rank uses, so that
  // cpu:0 counts rank 0's memory only.
  const Device host = Device::cpu(most_ranks);
  set_num_threads(2);
  const Clock::time_point start = Clock::now();
  const nn::Gpt full(config, kSeed);
  for (const Tensor& p : full.parameters()) p.set_data(p.to(host));
  int64_t total = 0;
  for (const Tensor& p : full.parameters()) total += p.numel();
  std::printf("%s with context %lld: %lld layers, %lld heads, width %lld, vocab %lld; %lld parameters (%s)\n",
              options.preset.c_str(), static_cast<long long>(config.context), static_cast<long long>(config.layers),
              static_cast<long long>(config.heads), static_cast<long long>(config.width),
              static_cast<long long>(config.vocab), static_cast<long long>(total), millions(total).c_str());
  std::printf(
      "built in %.1f s; formula: 16 B/param = 4 weight + 4 gradient + 8 AdamW (m, v), fp32, each device "
      "for its own parameters\n",
      std::chrono::duration<double>(Clock::now() - start).count());
  std::fflush(stdout);

  std::vector<LayoutMemory> layouts;
  for (const Requested& request : requested) {
    const MeshShape& shape = request.shape;
    layouts.push_back(request.zero_stage < 0 ? measure_layout(full, shape, request.mesh_zero, host)
                                             : measure_zero_layout(full, shape.dp, request.zero_stage, host));
    const LayoutMemory& layout = layouts.back();
    int64_t largest = 0;
    for (const RankMemory& m : layout.ranks) largest = std::max(largest, m.peak_formula);
    std::printf("%-18s %d device%s in %4.1f s: the largest device's peak formula %s MiB\n", layout.label.c_str(),
                shape.size(), shape.size() == 1 ? "" : "s", layout.seconds, mib(largest).c_str());
    std::fflush(stdout);
  }
  print_table(layouts);
  return 0;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  try {
    return lockstep::main_checked(argc, argv);
  } catch (const lockstep::UsageError& e) {
    std::fprintf(stderr, "gpt_layout_memory: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_layout_memory: %s\n", e.what());
    return 1;
  }
}
