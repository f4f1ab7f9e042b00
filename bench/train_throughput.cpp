// Training throughput of the built-in models (cnn, mlp, resnet) on Fashion-MNIST, Lockstep beside
// PyTorch (bench/torch_train.py) with the same model, batch, optimizer and thread count, and
// beside the machine's single-precision GEMM peak. Every measurement runs in a child process
// of its own, so each peak RSS is that run's alone and the two never share a process.
//
//   build/bin/train_throughput [--steps N] [--threads 1,2] [--models cnn,mlp] [--device cuda:0]
//
// With --device cuda:0 both sides train on the GPU (each batch copied there from the host,
// as a DataLoader user does), one thread, and the GEMM peak columns are left out
// (bench/cuda_gemm.cpp measures GPU GEMMs).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "child_process.h"
#include "lockstep/core/allocator.h"
#include "lockstep/core/autocast.h"
#include "lockstep/core/device.h"
#include "lockstep/core/parallel.h"
#include "lockstep/data/dataloader.h"
#include "lockstep/data/fashion_mnist.h"
#include "lockstep/nn/models.h"
#include "lockstep/ops/cpu/gemm.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/sgd.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using bench::ChildResult;
using bench::run_child;
using Clock = std::chrono::steady_clock;

constexpr int64_t kBatch = 256;
constexpr double kLr = 0.05;
constexpr double kMomentum = 0.9;
constexpr int64_t kGemmSize = 2048;

struct Options {
  std::vector<std::string> models{"cnn", "mlp"};
  std::vector<int> threads{1, 2};
  int64_t steps = 0;  // 0: each model's default (default_steps)
  int64_t warmup = 3;
  int64_t reps = 3;
  std::string repo;
  std::string data = kFashionMnistDefaultDir;
  std::string python = "/usr/bin/python3";
  std::string device = "cpu:0";
  std::string precision = "f32";  // GPUs: bf16 or f16 products (autocast on both sides)
  // Extra environment for every child, e.g. OMP_WAIT_POLICY=passive.
  std::vector<std::pair<std::string, std::string>> env;
};

// Sized so the whole program takes a minute or two on a 2-core machine.
int64_t default_steps(const std::string& model) { return model == "mlp" ? 80 : 30; }

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// ---------------------------------------------------------------- analytic FLOPs per sample
// Forward: 2 FLOPs per multiply-accumulate of the conv and linear layers. Backward: the
// weight-gradient GEMMs (as many MACs as the forward) plus the input-gradient GEMMs of every
// layer but the first (its input, the image, needs no gradient). Elementwise work (bias, ReLU,
// pooling, softmax, the optimizer) is left out: it is small beside the GEMMs.
struct Layer {
  const char* name;
  double macs;  // per sample
};

std::vector<Layer> gemm_layers(const std::string& model) {
  if (model == "cnn") {
    // 28 -conv3-> 26 -pool-> 13 -conv3-> 11 -pool-> 5
    return {{"conv1", 32.0 * 26 * 26 * (1 * 9)},
            {"conv2", 64.0 * 11 * 11 * (32 * 9)},
            {"fc1", 1600.0 * 128},
            {"fc2", 128.0 * 10}};
  }
  if (model == "resnet") {
    // 28x28 (stem, layer1) -> 14x14 (layer2) -> 7x7 (layer3), two blocks each; 3x3 convs,
    // 1x1 downsamples in the first block of layer2 and layer3
    return {{"conv1", 16.0 * 28 * 28 * (1 * 9)},           {"layer1.0.conv1", 16.0 * 28 * 28 * (16 * 9)},
            {"layer1.0.conv2", 16.0 * 28 * 28 * (16 * 9)}, {"layer1.1.conv1", 16.0 * 28 * 28 * (16 * 9)},
            {"layer1.1.conv2", 16.0 * 28 * 28 * (16 * 9)}, {"layer2.0.conv1", 32.0 * 14 * 14 * (16 * 9)},
            {"layer2.0.conv2", 32.0 * 14 * 14 * (32 * 9)}, {"layer2.0.downsample", 32.0 * 14 * 14 * 16},
            {"layer2.1.conv1", 32.0 * 14 * 14 * (32 * 9)}, {"layer2.1.conv2", 32.0 * 14 * 14 * (32 * 9)},
            {"layer3.0.conv1", 64.0 * 7 * 7 * (32 * 9)},   {"layer3.0.conv2", 64.0 * 7 * 7 * (64 * 9)},
            {"layer3.0.downsample", 64.0 * 7 * 7 * 32},    {"layer3.1.conv1", 64.0 * 7 * 7 * (64 * 9)},
            {"layer3.1.conv2", 64.0 * 7 * 7 * (64 * 9)},   {"fc", 64.0 * 10}};
  }
  return {{"fc1", 784.0 * 512}, {"fc2", 512.0 * 512}, {"fc3", 512.0 * 10}};
}

struct Flops {
  double forward = 0, backward = 0;
  double total() const { return forward + backward; }
};

Flops flops_per_sample(const std::string& model) {
  Flops f;
  const std::vector<Layer> layers = gemm_layers(model);
  for (size_t i = 0; i < layers.size(); ++i) {
    f.forward += 2 * layers[i].macs;
    f.backward += 2 * layers[i].macs * (i == 0 ? 1 : 2);
  }
  return f;
}

// ---------------------------------------------------------------- workers (child processes)
// A worker prints one line "RESULT key=value ..." on stdout; the parent parses it.

void print_result(const std::map<std::string, double>& values) {
  std::printf("RESULT");
  for (const auto& [key, value] : values) std::printf(" %s=%.6g", key.c_str(), value);
  std::printf("\n");
  std::fflush(stdout);
}

int train_worker(const std::string& model_name, int threads, int64_t steps, const Options& options) {
  set_num_threads(threads);
  const Device device = Device::parse(options.device);
  const TensorDataset train_set = load_fashion_mnist(options.data, Split::train);
  const std::shared_ptr<nn::Module> model = nn::make_model(model_name, 0);
  model->to(device);
  optim::SGD sgd(model->parameters(), {.lr = kLr, .momentum = kMomentum});
  DataLoader loader(train_set, {.batch_size = kBatch, .shuffle = true, .seed = 0, .drop_last = true});

  // Seconds per phase, summed over the timed steps.
  double data_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0, loss = 0;
  auto step = [&](bool timed) {
    auto t0 = Clock::now();
    std::optional<Batch> batch = loader.next();
    if (!batch) batch = loader.next();  // next epoch
    auto t1 = Clock::now();
    const Tensor images = batch->samples[kImageField].to(device), labels = batch->samples[kLabelField].to(device);
    const AutocastGuard autocast(parse_dtype(options.precision));
    Tensor loss_tensor = cross_entropy(model->forward(images), labels);
    auto t2 = Clock::now();
    loss_tensor.backward();
    auto t3 = Clock::now();
    sgd.step();
    sgd.zero_grad();
    auto t4 = Clock::now();
    loss = loss_tensor.item();  // waits for a GPU step to finish, as PyTorch's float(loss)
    if (timed) {
      data_s += std::chrono::duration<double>(t1 - t0).count();
      forward_s += std::chrono::duration<double>(t2 - t1).count();
      backward_s += std::chrono::duration<double>(t3 - t2).count();
      optimizer_s += std::chrono::duration<double>(t4 - t3).count();
    }
  };

  for (int64_t i = 0; i < options.warmup; ++i) step(false);
  reset_peak_memory_stats(device);
  std::vector<double> rates, step_seconds;
  for (int64_t r = 0; r < options.reps; ++r) {
    const auto start = Clock::now();
    for (int64_t i = 0; i < steps; ++i) step(true);
    const double elapsed = seconds_since(start);
    rates.push_back(static_cast<double>(steps * kBatch) / elapsed);
    step_seconds.push_back(elapsed);
  }
  const double timed_steps = static_cast<double>(steps * options.reps);
  double total_s = 0;
  for (const double s : step_seconds) total_s += s;
  print_result({{"samples_per_s", *std::max_element(rates.begin(), rates.end())},
                {"data_ms", 1e3 * data_s / timed_steps},
                {"fwd_ms", 1e3 * forward_s / timed_steps},
                {"bwd_ms", 1e3 * backward_s / timed_steps},
                {"opt_ms", 1e3 * optimizer_s / timed_steps},
                {"step_ms", 1e3 * total_s / timed_steps},
                {"tensor_peak_mb", static_cast<double>(memory_stats(device).peak_allocated_bytes) / (1 << 20)},
                {"loss", loss}});
  return 0;
}

// Best of a few large square SGEMMs, two ways: through lockstep::cpu::gemm (what the ops call:
// OpenBLAS kept single-threaded, the product split across this thread's OpenMP team), and
// plain cblas_sgemm with OpenBLAS's own pthreads at the same count. The better one is the
// machine's peak.
int gemm_worker(int threads) {
  const int64_t n = kGemmSize;
  std::vector<float> a(static_cast<size_t>(n * n)), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i % 17) * 0.01f;
    b[i] = static_cast<float>(i % 13) * 0.01f;
  }
  auto best_gflops = [&](const auto& multiply) {
    double best = 1e30;
    for (int run = 0; run < 6; ++run) {  // the first warms caches and threads
      const auto start = Clock::now();
      multiply();
      if (run > 0) best = std::min(best, seconds_since(start));
    }
    return 2.0 * static_cast<double>(n * n * n) / best / 1e9;
  };
  set_num_threads(threads);
  const double ours =
      best_gflops([&] { cpu::gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n); });
  openblas_set_num_threads(threads);
  const double blas = best_gflops([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(n), static_cast<blasint>(n),
                static_cast<blasint>(n), 1.0f, a.data(), static_cast<blasint>(n), b.data(), static_cast<blasint>(n),
                0.0f, c.data(), static_cast<blasint>(n));
  });
  // The MLP's own products at batch 256, alone: forward x·Wᵀ, input gradients g·W (not for
  // the first layer), weight gradients gᵀ·x. No training step can beat this on the same BLAS.
  struct Product {
    bool trans_a, trans_b;
    int64_t m, n, k;
  };
  const std::vector<Product> mlp = {{false, true, kBatch, 512, 784},  {false, true, kBatch, 512, 512},
                                    {false, true, kBatch, 10, 512},   {false, false, kBatch, 512, 10},
                                    {false, false, kBatch, 512, 512}, {true, false, 512, 784, kBatch},
                                    {true, false, 512, 512, kBatch},  {true, false, 10, 512, kBatch}};
  openblas_set_num_threads(1);
  double mlp_flops = 0, mlp_best = 1e30;
  for (const Product& p : mlp) mlp_flops += 2.0 * static_cast<double>(p.m * p.n * p.k);
  for (int run = 0; run < 20; ++run) {
    const auto start = Clock::now();
    for (const Product& p : mlp)
      cpu::gemm<float>(p.trans_a, p.trans_b, p.m, p.n, p.k, 1.0f, a.data(), p.trans_a ? p.m : p.k, b.data(),
                       p.trans_b ? p.k : p.n, 0.0f, c.data(), p.n);
    if (run > 0) mlp_best = std::min(mlp_best, seconds_since(start));
  }
  print_result({{"gflops", std::max(ours, blas)},
                {"lockstep_gemm", ours},
                {"openblas", blas},
                {"mlp_gemms", mlp_flops / mlp_best / 1e9}});
  return 0;
}

// ---------------------------------------------------------------- parent
double number(const ChildResult& r, const std::string& key) {
  const auto it = r.values.find(key);
  return it == r.values.end() ? 0.0 : std::atof(it->second.c_str());
}

// The repository root: --repo, else where this source file was compiled from, else relative to
// the executable (build/bin/train_throughput), else the working directory.
std::string find_repo(const Options& options) {
  std::vector<fs::path> candidates;
  if (!options.repo.empty()) return options.repo;
  candidates.push_back(fs::path(__FILE__).parent_path().parent_path());
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path().parent_path().parent_path());
  candidates.push_back(fs::current_path());
  for (const fs::path& dir : candidates) {
    if (fs::exists(dir / "bench" / "torch_train.py", ec)) return dir.string();
  }
  return "";
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

// Both sides get the same thread count in every pool they might use, then --env on top.
std::vector<std::pair<std::string, std::string>> child_env(int threads, const Options& options) {
  const std::string t = std::to_string(threads);
  std::vector<std::pair<std::string, std::string>> env = {
      {"OMP_NUM_THREADS", t}, {"OPENBLAS_NUM_THREADS", t}, {"MKL_NUM_THREADS", t}};
  env.insert(env.end(), options.env.begin(), options.env.end());
  return env;
}

std::string fmt(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), format, value);
  return text;
}

// The first three fields of /proc/loadavg: 1, 5 and 15 minute load averages.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return in ? one + " " + five + " " + fifteen + " (" + std::to_string(host_cores()) + " cores)" : "unknown";
}

int parent_main(const std::string& self, const Options& options) {
  const std::string repo = find_repo(options);
  const std::string script = repo.empty() ? "" : repo + "/bench/torch_train.py";
  std::string torch_note;
  bool have_torch = false;
  if (script.empty()) {
    torch_note = "bench/torch_train.py not found (pass --repo DIR): PyTorch columns skipped";
  } else {
    const ChildResult probe = run_child({options.python, script, "--probe"}, {});
    have_torch = probe.ok;
    torch_note = probe.ok ? "PyTorch " + probe.values.at("torch") + ", BLAS " + probe.values.at("blas") +
                                ", oneDNN (mkldnn) " + probe.values.at("onednn")
                          : options.python + " cannot run PyTorch (" + probe.failure + "): PyTorch columns skipped";
  }

  std::printf("train_throughput: batch %lld, SGD lr %g momentum %g, Fashion-MNIST train (%s), shuffled\n",
              static_cast<long long>(kBatch), kLr, kMomentum, options.data.c_str());
  std::printf(
      "each figure: the best of %lld timed repetitions of N steps after %lld warm-up steps (other work on the "
      "machine only ever slows a run down), one process per run\n",
      static_cast<long long>(options.reps), static_cast<long long>(options.warmup));
  std::printf("Lockstep BLAS: %s (core %s); %s\n", openblas_get_config(), openblas_get_corename(), torch_note.c_str());
  std::string env_note = "child environment: OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = MKL_NUM_THREADS = threads";
  for (const auto& [key, value] : options.env) env_note += ", " + key + "=" + value;
  std::printf("%s\n", env_note.c_str());
  std::printf("load average before: %s (other processes on the machine distort every figure)\n",
              load_average().c_str());
  for (const std::string& model : options.models) {
    const Flops f = flops_per_sample(model);
    std::printf(
        "FLOPs/sample %s: %.2f M forward + %.2f M backward = %.2f M (conv/linear GEMMs only; the first "
        "layer's input gradient is not computed)\n",
        model.c_str(), f.forward / 1e6, f.backward / 1e6, f.total() / 1e6);
  }
  std::printf("\n");

  struct Row {
    std::string model;
    int threads;
    int64_t steps;
    ChildResult ours, theirs;
    double peak;
  };
  std::vector<Row> rows;
  std::string gemm_notes;
  const bool gpu = Device::parse(options.device).is_cuda();
  for (const int threads : options.threads) {
    const ChildResult gemm =
        gpu ? ChildResult{} : run_child({self, "--worker-gemm", std::to_string(threads)}, child_env(threads, options));
    const double peak = number(gemm, "gflops");
    if (!gpu && !gemm.ok) std::fprintf(stderr, "GEMM peak run failed: %s\n", gemm.failure.c_str());
    gemm_notes += " " + std::to_string(threads) + " thread(s): lockstep::cpu::gemm " +
                  fmt("%.1f", number(gemm, "lockstep_gemm")) + ", OpenBLAS's own threads " +
                  fmt("%.1f", number(gemm, "openblas")) + ", the MLP's own GEMMs alone (batch " +
                  std::to_string(kBatch) + ") " + fmt("%.1f", number(gemm, "mlp_gemms")) + ";";
    for (const std::string& model : options.models) {
      const int64_t steps = options.steps > 0 ? options.steps : default_steps(model);
      const std::vector<std::string> common = {"--model",     model,
                                               "--threads",   std::to_string(threads),
                                               "--steps",     std::to_string(steps),
                                               "--warmup",    std::to_string(options.warmup),
                                               "--reps",      std::to_string(options.reps),
                                               "--data",      options.data,
                                               "--device",    options.device,
                                               "--precision", options.precision};
      std::vector<std::string> ours = {self, "--worker"};
      ours.insert(ours.end(), common.begin(), common.end());
      Row row{model, threads, steps, run_child(ours, child_env(threads, options)), {}, peak};
      if (!row.ours.ok) std::fprintf(stderr, "Lockstep %s run failed: %s\n", model.c_str(), row.ours.failure.c_str());
      if (have_torch) {
        std::vector<std::string> theirs = {options.python, script};
        theirs.insert(theirs.end(), common.begin(), common.end());
        theirs.push_back("--batch");
        theirs.push_back(std::to_string(kBatch));
        row.theirs = run_child(theirs, child_env(threads, options));
        if (!row.theirs.ok)
          std::fprintf(stderr, "PyTorch %s run failed: %s\n", model.c_str(), row.theirs.failure.c_str());
      }
      rows.push_back(row);
    }
  }

  std::printf("%-5s %3s %6s | %10s %10s %6s | %9s %10s %7s | %9s %9s\n", "model", "thr", "steps", "ours/s", "torch/s",
              "ratio", "ours GF/s", "sgemm GF/s", "% peak", "ours RSS", "torch RSS");
  for (const Row& r : rows) {
    const double ours = number(r.ours, "samples_per_s"), theirs = number(r.theirs, "samples_per_s");
    const double gflops = ours * flops_per_sample(r.model).total() / 1e9;
    std::printf("%-5s %3d %6lld | %10s %10s %6s | %9s %10s %7s | %9s %9s\n", r.model.c_str(), r.threads,
                static_cast<long long>(r.steps), r.ours.ok ? fmt("%.0f", ours).c_str() : "failed",
                r.theirs.ok ? fmt("%.0f", theirs).c_str() : "n/a",
                r.ours.ok && r.theirs.ok ? fmt("%.2f", ours / theirs).c_str() : "-",
                r.ours.ok ? fmt("%.1f", gflops).c_str() : "-", r.peak > 0 ? fmt("%.1f", r.peak).c_str() : "-",
                r.ours.ok && r.peak > 0 ? fmt("%.1f%%", 100 * gflops / r.peak).c_str() : "-",
                r.ours.ok ? fmt("%.0f MiB", r.ours.peak_rss_mb).c_str() : "-",
                r.theirs.ok ? fmt("%.0f MiB", r.theirs.peak_rss_mb).c_str() : "-");
  }
  for (const Row& r : rows) {  // one line per run for scripts (scripts/gpu-check)
    if (r.ours.ok && r.theirs.ok) {
      std::printf("SUMMARY %s threads=%d device=%s precision=%s ours=%.0f torch=%.0f ratio=%.3f\n", r.model.c_str(),
                  r.threads, options.device.c_str(), options.precision.c_str(), number(r.ours, "samples_per_s"),
                  number(r.theirs, "samples_per_s"),
                  number(r.ours, "samples_per_s") / number(r.theirs, "samples_per_s"));
    }
  }
  std::printf(
      "ours/s, torch/s: training samples per second; ratio: ours / torch; GF/s from the FLOPs above; "
      "sgemm: best %lld^3 SGEMM at that thread count, the better of two paths; RSS: the run's peak (wait4 ru_maxrss)\n"
      "sgemm GF/s by path:%s\n",
      static_cast<long long>(kGemmSize), gemm_notes.c_str());

  std::printf("\nwhere a step's time goes (ms per step, mean over the timed steps):\n");
  std::printf("%-5s %3s %-8s | %7s %8s %8s %9s %7s | %8s\n", "model", "thr", "side", "data", "forward", "backward",
              "optimizer", "other", "step");
  for (const Row& r : rows) {
    for (const auto& [side, run] :
         {std::pair<const char*, const ChildResult*>{"lockstep", &r.ours}, {"pytorch", &r.theirs}}) {
      if (!run->ok) continue;
      const double data = number(*run, "data_ms"), fwd = number(*run, "fwd_ms"), bwd = number(*run, "bwd_ms"),
                   opt = number(*run, "opt_ms"), step = number(*run, "step_ms");
      std::printf("%-5s %3d %-8s | %7.2f %8.2f %8.2f %9.2f %7.2f | %8.2f\n", r.model.c_str(), r.threads, side, data,
                  fwd, bwd, opt, step - data - fwd - bwd - opt, step);
    }
  }
  std::printf("forward includes the loss; optimizer includes zero_grad; other: freeing the graph and the loop\n");
  std::printf("load average after: %s\n", load_average().c_str());
  return 0;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr,
               "train_throughput: %s\n"
               "usage: train_throughput [--steps N] [--threads 1,2] [--models cnn,mlp] [--warmup N] [--reps N]\n"
               "                        [--repo DIR] [--data DIR] [--python PATH] [--env KEY=VALUE,...]\n",
               message.c_str());
  return 2;
}

int main_checked(int argc, char** argv) {
  Options options;
  bool worker = false;  // hidden: a child's training run (--model, one --threads value)
  std::string worker_model;
  int gemm_threads = 0;  // hidden: a child's GEMM peak run
  const std::map<std::string, std::function<void(const std::string&)>> setters = {
      {"--steps", [&](const std::string& v) { options.steps = std::stoll(v); }},
      {"--warmup", [&](const std::string& v) { options.warmup = std::stoll(v); }},
      {"--reps", [&](const std::string& v) { options.reps = std::stoll(v); }},
      {"--models", [&](const std::string& v) { options.models = split(v); }},
      {"--repo", [&](const std::string& v) { options.repo = v; }},
      {"--data", [&](const std::string& v) { options.data = v; }},
      {"--python", [&](const std::string& v) { options.python = v; }},
      {"--device", [&](const std::string& v) { options.device = v; }},
      {"--precision", [&](const std::string& v) { options.precision = v; }},
      {"--env",
       [&](const std::string& v) {
         for (const std::string& pair : split(v)) {
           const size_t eq = pair.find('=');
           if (eq == std::string::npos || eq == 0) throw std::invalid_argument(pair);
           options.env.emplace_back(pair.substr(0, eq), pair.substr(eq + 1));
         }
       }},
      {"--model", [&](const std::string& v) { worker_model = v; }},
      {"--worker-gemm", [&](const std::string& v) { gemm_threads = std::stoi(v); }},
      {"--threads",
       [&](const std::string& v) {
         options.threads.clear();
         for (const std::string& t : split(v)) options.threads.push_back(std::stoi(t));
       }},
  };
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    if (flag == "--help" || flag == "-h") {
      usage_error("training throughput, Lockstep beside PyTorch");
      return 0;
    }
    if (flag == "--worker") {
      worker = true;
      continue;
    }
    if (const size_t eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return usage_error(flag + " needs a value");
    }
    const auto setter = setters.find(flag);
    if (setter == setters.end()) return usage_error("unknown flag " + flag);
    try {
      setter->second(value);
    } catch (const std::logic_error&) {
      return usage_error("bad value '" + value + "' for " + flag);
    }
  }
  if (options.reps < 1 || options.steps < 0 || options.warmup < 0) {
    return usage_error("--reps must be at least 1 and --steps, --warmup at least 0");
  }
  if (options.threads.empty()) return usage_error("--threads must list at least one count");
  for (const int t : options.threads) {
    if (t < 1) return usage_error("--threads must list counts of at least 1");
  }
  const std::vector<std::string> known = nn::model_names();
  for (const std::string& m : options.models) {
    if (std::find(known.begin(), known.end(), m) == known.end()) return usage_error("unknown model '" + m + "'");
  }

  if (gemm_threads > 0) return gemm_worker(gemm_threads);
  if (worker) {
    return train_worker(worker_model, options.threads.front(),
                        options.steps > 0 ? options.steps : default_steps(worker_model), options);
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return parent_main(ec ? fs::absolute(argv[0]).string() : self.string(), options);
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  try {
    return lockstep::main_checked(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_throughput: %s\n", e.what());
    return 1;
  }
}
