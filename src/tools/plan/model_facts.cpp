#include "tools/plan/model_facts.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "lockstep/comm/local_communicator.h"
#include "lockstep/core/allocator.h"
#include "lockstep/core/autocast.h"
#include "lockstep/core/parallel.h"
#include "lockstep/core/philox.h"
#include "lockstep/nn/models.h"
#include "lockstep/ops/elementwise.h"
#include "lockstep/ops/loss.h"
#include "lockstep/parallel/gpt_mesh.h"
#include "lockstep/parallel/gpt_stage.h"
#include "lockstep/parallel/parameter_gathering.h"
#include "tools/common/zero3_units.h"

namespace lockstep::tools {
namespace {

using Clock = std::chrono::steady_clock;

DType autocast_type(const std::string& precision) {
  if (precision == "bf16") return DType::bf16;
  if (precision == "f16") return DType::f16;
  return DType::f32;
}

int64_t element_count(const nn::Module& model) {
  int64_t count = 0;
  for (const auto& [name, parameter] : model.named_parameters()) count += parameter.numel();
  return count;
}

// ZeRO-3's gathering groups of the model (parameter_gathering.h): the elements of group 0
// (gathered for the whole step), and of every unit, largest first.
struct GatherGroups {
  int64_t always = 0;
  std::vector<int64_t> units;
};

GatherGroups gather_groups(nn::Module& model, const std::string& name) {
  const parallel::GatherPlan plan = parallel::plan_gathering(model, zero3_unit_types(name));
  const std::vector<Tensor> params = model.parameters();
  std::vector<int64_t> sizes(plan.modules.size() + 1, 0);
  for (size_t i = 0; i < params.size(); ++i) sizes[plan.group_of[i]] += params[i].numel();
  GatherGroups groups{.always = sizes[0], .units = std::vector<int64_t>(sizes.begin() + 1, sizes.end())};
  std::sort(groups.units.rbegin(), groups.units.rend());
  return groups;
}

// What a rank holds gathered at the most: group 0 and two units (the one in use and the
// one prefetched).
int64_t most_gathered(const GatherGroups& groups, int64_t units) {
  int64_t total = groups.always;
  for (size_t u = 0; u < groups.units.size() && u < static_cast<size_t>(units); ++u) total += groups.units[u];
  return total;
}

// One forward and backward of `loss_of(m)` on cpu:0: the bytes allocated beyond the weights
// once forward is done (what backward needs kept) and at the most during backward, less the
// gradients it leaves (a layout keeps those in buffers of its own); its seconds.
struct Probe {
  double kept = 0, peak = 0, seconds = 0;
};
Probe probe(nn::Module& model, const std::function<Tensor(int64_t)>& loss_of, int64_t m, DType precision) {
  const Device device = Device::cpu(0);
  model.zero_grad();
  const int64_t before = memory_stats(device).allocated_bytes;
  reset_peak_memory_stats(device);
  Probe result;
  const auto start = Clock::now();
  {
    AutocastGuard autocast(precision);
    const Tensor loss = loss_of(m);
    result.kept = static_cast<double>(memory_stats(device).allocated_bytes - before);
    loss.backward();
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double gradients = 4.0 * static_cast<double>(element_count(model));
  result.peak = static_cast<double>(memory_stats(device).peak_allocated_bytes - before) - gradients;
  model.zero_grad();
  return result;
}

// What a pass keeps per sample, what backward adds to it, and the bytes a micro-batch needs
// whatever its size: from passes of one and two samples (after one that warms the allocator
// up) where `two_sizes`, else from one pass of one sample, whose bytes are then all taken as
// per sample (what a micro-batch needs whatever its size is small beside them).
struct Scaled {
  double kept = 0, transient = 0;  // per sample: kept after forward; the most backward adds to it
  double fixed_bytes = 0;
};
Scaled scaled_probe(nn::Module& model, const std::function<Tensor(int64_t)>& loss_of, DType precision, bool two_sizes) {
  Scaled s;
  if (!two_sizes) {
    const Probe one = probe(model, loss_of, 1, precision);
    s.kept = one.kept;
    s.transient = std::max(0.0, one.peak - one.kept);
    return s;
  }
  (void)probe(model, loss_of, 1, precision);
  const Probe one = probe(model, loss_of, 1, precision);
  const Probe two = probe(model, loss_of, 2, precision);
  s.kept = std::max(0.0, two.kept - one.kept);
  s.transient = std::max(0.0, (two.peak - one.peak) - s.kept);
  s.fixed_bytes = std::max(0.0, one.peak - (s.kept + s.transient));
  return s;
}

// The seconds of a forward and backward, per sample and fixed, from passes of one and two
// samples (after one that warms the allocator and the threads up). A pass takes
// milliseconds, so a preemption or a page fault doubles one, and this host's speed moves
// from one second to the next: the two sizes are timed in turn for about a tenth of a second
// and each one's median taken, how long a pass takes most of the time, as the median of a
// training's step times is.
struct SampleSeconds {
  double per_sample = 0, fixed = 0;
};
SampleSeconds sample_seconds(nn::Module& model, const std::function<Tensor(int64_t)>& loss_of, DType precision) {
  constexpr double kBudgetSeconds = 0.1;
  constexpr size_t kMost = 25;
  (void)probe(model, loss_of, 1, precision);
  std::vector<double> ones, twos;
  const auto start = Clock::now();
  // A model whose pass takes longer than the budget is timed once: its seconds are long
  // beside a preemption.
  while (ones.empty() ||
         (ones.size() < kMost && std::chrono::duration<double>(Clock::now() - start).count() < kBudgetSeconds)) {
    ones.push_back(probe(model, loss_of, 1, precision).seconds);
    twos.push_back(probe(model, loss_of, 2, precision).seconds);
  }
  const auto median = [](std::vector<double>& v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  const double one = median(ones), two = median(twos);
  SampleSeconds s;
  // Timing is noisier than counting: a micro-batch of two costs at least one of one.
  s.per_sample = std::clamp(two - one, two / 4, two / 2);
  s.fixed = std::max(0.0, one - s.per_sample);
  return s;
}

// A block's share and the rest's, from models of one block (a) and two (b).
ActivationBytes split_blocks(const Scaled& a, const Scaled& b) {
  ActivationBytes bytes;
  bytes.block_kept = std::max(0.0, b.kept - a.kept);
  bytes.rest_kept = std::max(0.0, a.kept - bytes.block_kept);
  // Backward works on one block at a time: what it adds does not grow with the blocks. The
  // last stage's is the measured one (its head and a block); a stage of blocks alone adds
  // about a block's activations (their gradients).
  bytes.last_transient = std::max(a.transient, b.transient);
  bytes.other_transient = std::min(bytes.last_transient, bytes.block_kept);
  return bytes;
}

std::function<Tensor(int64_t)> gpt_loss_of(nn::Gpt& model) {
  return [&model](int64_t m) {
    const nn::GptConfig& c = model.config;
    Philox rng(1, 2);
    std::vector<int64_t> tokens(static_cast<size_t>(m * c.context)), targets(tokens.size());
    for (int64_t& t : tokens) t = rng.next_u32() % c.vocab;
    for (int64_t& t : targets) t = rng.next_u32() % c.vocab;
    const Tensor x = Tensor::from_vector(tokens, {m, c.context});
    const Tensor y = Tensor::from_vector(targets, {m, c.context});
    return nn::gpt_loss(model.forward(x), y);
  };
}

// The FLOPs of a sample through one block and through the rest, forward and backward (3x
// forward): the block's four products (12 w^2 weights) and attention's two T x T products;
// the head's product with the vocabulary.
double gpt_block_flops(const nn::GptConfig& c) {
  const double t = static_cast<double>(c.context), w = static_cast<double>(c.width);
  return 3.0 * t * (24.0 * w * w + 4.0 * t * w);
}
double gpt_base_flops(const nn::GptConfig& c) {
  return 3.0 * static_cast<double>(c.context) * 2.0 * static_cast<double>(c.width) * static_cast<double>(c.vocab);
}

}  // namespace

ModelFacts gpt_model_facts(const nn::GptConfig& config, const std::string& precision, int threads, bool timed) {
  nn::check_gpt_config(config);
  const auto start = Clock::now();
  const int previous = num_threads();
  set_num_threads(threads);
  const DType autocast = autocast_type(precision);

  ModelFacts facts;
  facts.transformer = true;
  facts.gpt = config;
  facts.parameters = static_cast<int64_t>(nn::gpt_parameter_count(config));
  facts.label = "GPT: " + std::to_string(config.layers) + " layers, width " + std::to_string(config.width) + ", " +
                std::to_string(config.heads) + " heads, context " + std::to_string(config.context) + ", vocabulary " +
                std::to_string(config.vocab);

  // One block and two, plain and checkpointed: a block's share is their difference.
  Scaled plain[2], checkpointed[2];
  SampleSeconds one_block;
  for (int blocks = 1; blocks <= 2; ++blocks) {
    nn::GptConfig small = config;
    small.layers = blocks;
    nn::Gpt model(small, 1);
    plain[blocks - 1] = scaled_probe(model, gpt_loss_of(model), autocast, timed);
    if (timed && blocks == 1) one_block = sample_seconds(model, gpt_loss_of(model), autocast);
    model.checkpoint_activations = true;
    checkpointed[blocks - 1] = scaled_probe(model, gpt_loss_of(model), autocast, timed);
  }
  set_num_threads(previous);
  facts.activations = split_blocks(plain[0], plain[1]);
  facts.checkpointed = split_blocks(checkpointed[0], checkpointed[1]);
  // A pipeline's first stage keeps the embeddings' outputs, its last the head's: measure the
  // former alone, as the model's forward computes them.
  {
    nn::GptConfig small = config;
    small.layers = 1;
    nn::Gpt model(small, 1);
    const auto embedded = [&](int64_t m) {
      const Device device = Device::cpu(0);
      const int64_t before = memory_stats(device).allocated_bytes;
      const Tensor tokens = Tensor::zeros({m, config.context}, DType::i64);
      const Tensor x = model.wte->forward(tokens) + model.wpe->forward(nn::gpt_positions(tokens, config));
      return static_cast<double>(memory_stats(device).allocated_bytes - before);
    };
    const double first = std::max(0.0, embedded(2) - embedded(1));
    facts.activations.first_kept = std::min(first, facts.activations.rest_kept);
    facts.checkpointed.first_kept = std::min(first, facts.checkpointed.rest_kept);
  }
  facts.workspace_bytes = std::max(plain[1].fixed_bytes, checkpointed[1].fixed_bytes);
  // Timed on one block and on up to four: a block's share is their difference over the
  // blocks between, which a millisecond of noise in either cannot swamp as it swamps the
  // difference between one block and two.
  if (timed) {
    nn::GptConfig many_blocks = config;
    many_blocks.layers = std::clamp<int64_t>(config.layers, 2, 4);
    nn::Gpt model(many_blocks, 1);
    set_num_threads(threads);
    const SampleSeconds many = sample_seconds(model, gpt_loss_of(model), autocast);
    set_num_threads(previous);
    facts.block.seconds =
        std::max(0.0, (many.per_sample - one_block.per_sample) / static_cast<double>(many_blocks.layers - 1));
    facts.base.seconds = std::max(one_block.per_sample - facts.block.seconds, 0.0);
    facts.micro_batch_seconds = many.fixed;
  }
  facts.block.flops = gpt_block_flops(config);
  facts.base.flops = gpt_base_flops(config);

  // The devices' parameters as the mesh builds them, cut for rank 0 of a tensor-parallel
  // group (every rank of a group holds the same shapes). Blocks are alike, so the stages of
  // a three-block model give every stage of the real one: a block's own parameters (the
  // middle stage), what the first and the last stage hold besides their blocks, and the
  // last stage's copy of the tied head.
  nn::GptConfig three = config;
  three.layers = 3;
  auto full = std::make_shared<nn::Gpt>(three, 1);
  // Every block is one unit, and the rest is group 0 whatever the block count.
  facts.zero3_gathered = most_gathered(gather_groups(*full, "gpt"), std::min<int64_t>(2, config.layers));
  struct Cut {
    int64_t block = 0, first_extra = 0, last_extra = 0, whole_extra = 0, head_copy = 0;
  };
  auto cuts = std::make_shared<std::map<int, Cut>>();
  const nn::GptConfig real = config;
  facts.share = [full, cuts, real](int tp, int pp, int stage) {
    auto found = cuts->find(tp);
    if (found == cuts->end()) {
      const auto group = comm::LocalCommunicator::create_group(tp);
      const auto count = [&](const std::vector<int64_t>& blocks, int s, int64_t* head_copy = nullptr) {
        parallel::GptStage built(*full, parallel::gpt_stage_plans(blocks)[static_cast<size_t>(s)], group[0]);
        if (head_copy != nullptr) *head_copy = built.head_weight.numel();
        return element_count(built);
      };
      Cut cut;
      cut.block = count({1, 1, 1}, 1);
      cut.first_extra = count({1, 1, 1}, 0) - cut.block;
      cut.last_extra = count({1, 1, 1}, 2, &cut.head_copy) - cut.block;
      cut.whole_extra = count({3}, 0) - 3 * cut.block;
      found = cuts->emplace(tp, cut).first;
    }
    const Cut& cut = found->second;
    parallel::GptMeshOptions options;
    options.mesh = {.dp = 1, .tp = tp, .pp = pp};
    const int64_t blocks = parallel::gpt_blocks_per_stage(real, options)[static_cast<size_t>(stage)];
    const bool first = stage == 0, last = stage == pp - 1;
    const int64_t extra = first && last ? cut.whole_extra : first ? cut.first_extra : last ? cut.last_extra : 0;
    return DeviceShare{.trained = extra + blocks * cut.block,
                       .copied = last && !first ? cut.head_copy : 0,
                       .blocks = blocks,
                       .first = first,
                       .last = last};
  };
  facts.measure_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return facts;
}

ModelFacts image_model_facts(const std::string& name, const std::string& precision, int threads, bool timed) {
  const auto start = Clock::now();
  const int previous = num_threads();
  set_num_threads(threads);
  std::shared_ptr<nn::Module> model = nn::make_model(name, 1);
  const auto loss_of = [&model](int64_t m) {
    Philox rng(1, 2);
    std::vector<float> pixels(static_cast<size_t>(m * 28 * 28));
    for (float& p : pixels) p = static_cast<float>(rng.next_u32() % 256) / 255.0f;
    std::vector<int64_t> labels(static_cast<size_t>(m));
    for (int64_t& l : labels) l = rng.next_u32() % 10;
    return cross_entropy(model->forward(Tensor::from_vector(pixels, {m, 1, 28, 28})), Tensor::from_vector(labels, {m}));
  };
  const Scaled scaled = scaled_probe(*model, loss_of, autocast_type(precision), timed);
  const SampleSeconds seconds = timed ? sample_seconds(*model, loss_of, autocast_type(precision)) : SampleSeconds{};
  set_num_threads(previous);

  ModelFacts facts;
  facts.label = name + " (Fashion-MNIST's 28x28 images, 10 classes)";
  facts.parameters = element_count(*model);
  facts.zero3_gathered = most_gathered(gather_groups(*model, name), 2);
  facts.activations = {.rest_kept = scaled.kept, .last_transient = scaled.transient};
  facts.base.seconds = seconds.per_sample;
  facts.workspace_bytes = scaled.fixed_bytes;
  facts.micro_batch_seconds = seconds.fixed;
  const int64_t parameters = facts.parameters;
  facts.share = [parameters](int, int, int) { return DeviceShare{.trained = parameters}; };
  facts.measure_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return facts;
}

}  // namespace lockstep::tools
