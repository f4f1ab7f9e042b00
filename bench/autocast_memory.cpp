// What a GPT keeps for backward under autocast, Lockstep beside PyTorch: one forward on a CPU
// device in f32 and under bf16, and the bytes held by live tensors once forward is done (the
// activations backward reads, the logits and the loss), from the device's own accounting
// (memory_stats). CPU devices run autocast as GPUs do (core/autocast.h), so this is the
// saving a GPU run gets, measured where there is no GPU. PyTorch's side (torch_autocast_memory.py)
// counts the tensors autograd saves, under torch.autocast("cpu", torch.bfloat16).
//
//   build/bin/autocast_memory [--preset tiny|small|gpt2-124m] [--batch 8] [--repo DIR] [--python P]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "child_process.h"
#include "lockstep/core/allocator.h"
#include "lockstep/core/autocast.h"
#include "lockstep/nn/gpt.h"
#include "lockstep/ops/ops.h"

namespace lockstep {
namespace {

struct Options {
  std::string preset = "tiny";
  int64_t batch = 8;
  std::string repo = ".";
  std::string python = "/usr/bin/python3";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--preset") {
      o.preset = value;
    } else if (flag == "--batch") {
      o.batch = std::stoll(value);
    } else if (flag == "--repo") {
      o.repo = value;
    } else if (flag == "--python") {
      o.python = value;
    } else {
      std::fprintf(stderr, "autocast_memory: unknown flag %s (--preset, --batch, --repo, --python)\n", flag.c_str());
      std::exit(2);
    }
  }
  return o;
}

// Bytes live on cpu:0 after one forward under `type`, beyond the model's.
int64_t kept_after_forward(nn::Gpt& model, const Tensor& tokens, const Tensor& targets, DType type) {
  model.zero_grad();
  const Device device = Device::cpu(0);
  const int64_t before = memory_stats(device).allocated_bytes;
  const AutocastGuard autocast(type);
  const Tensor loss = nn::gpt_loss(model.forward(tokens), targets);
  const int64_t kept = memory_stats(device).allocated_bytes - before;
  loss.backward();  // as a step would: what forward kept is what backward reads
  return kept;
}

// PyTorch's RESULT (its version, f32_bytes, bf16_bytes); not ok when it did not run.
bench::ChildResult torch_result(const Options& o, const nn::GptConfig& c) {
  const auto number = [](int64_t v) { return std::to_string(v); };
  return bench::run_child(
      {o.python, o.repo + "/bench/torch_autocast_memory.py", "--layers", number(c.layers), "--heads", number(c.heads),
       "--width", number(c.width), "--context", number(c.context), "--batch", number(o.batch)},
      {});
}

double mib(double bytes) { return bytes / (1 << 20); }

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const nn::GptConfig config = nn::gpt_preset(o.preset);
  nn::Gpt model(config, 0);
  std::vector<int64_t> tokens(static_cast<size_t>(o.batch * config.context)), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int64_t>(i * 2654435761u % 256);
    targets[i] = static_cast<int64_t>((i + 1) * 2654435761u % 256);
  }
  const Tensor t = Tensor::from_vector(tokens, {o.batch, config.context}),
               y = Tensor::from_vector(targets, {o.batch, config.context});
  const double f32 = static_cast<double>(kept_after_forward(model, t, y, DType::f32));
  const double bf16 = static_cast<double>(kept_after_forward(model, t, y, DType::bf16));
  std::printf("GPT %s (%lld layers, width %lld, context %lld), batch %lld, one forward on a CPU device\n",
              o.preset.c_str(), static_cast<long long>(config.layers), static_cast<long long>(config.width),
              static_cast<long long>(config.context), static_cast<long long>(o.batch));
  std::printf("%-44s %10s %10s %8s\n", "kept for backward", "f32 MiB", "bf16 MiB", "bf16/f32");
  std::printf("%-44s %10.2f %10.2f %8.3f\n", "Lockstep (live bytes after forward)", mib(f32), mib(bf16), bf16 / f32);
  const bench::ChildResult torch = torch_result(o, config);
  if (torch.ok) {
    const double tf32 = std::stod(torch.values.at("f32_bytes")), tbf16 = std::stod(torch.values.at("bf16_bytes"));
    const std::string label = "PyTorch " + torch.values.at("torch") + " (saved tensors)";
    std::printf("%-44s %10.2f %10.2f %8.3f\n", label.c_str(), mib(tf32), mib(tbf16), tbf16 / tf32);
  } else {
    std::printf("%-44s %s\n", "PyTorch", ("not run: " + torch.failure).c_str());
  }
  std::printf("RESULT preset=%s batch=%lld ours_f32_bytes=%.0f ours_bf16_bytes=%.0f ours_ratio=%.4f\n",
              o.preset.c_str(), static_cast<long long>(o.batch), f32, bf16, bf16 / f32);
  return 0;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) { return lockstep::run(argc, argv); }
