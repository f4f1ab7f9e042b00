// Training throughput of the built-in models (cnn, mlp, resnet) on Fashion-MNIST and of the GPT
// (nn/gpt.h) on byte-level text, Lockstep beside PyTorch (bench/torch_train.py) with the same
// model, batch, optimizer and thread count, and beside the machine's single-precision GEMM peak.
// Every measurement runs in a child process of its own, so each peak RSS is that run's alone
// and the two never share a process.
//
//   build/bin/train_throughput [--steps N] [--threads 1,2] [--models cnn,mlp,gpt] [--device cuda:0]
//   build/bin/train_throughput --models gpt --preset small [--text FILE] [--batch N]
//
// The GPT trains as `lockstep train --model gpt` does (a preset's shape, batch 32, AdamW lr
// 1e-3 without weight decay) on the training split of its text (the fortunes, or --text FILE),
// cut into windows of `context` bytes; both sides read the same bytes. Its figures are also
// given in tokens per second (samples/s x context). Under --precision bf16 the two autocasts
// differ a little on the GPT (PyTorch's also writes the products' outputs in bf16):
// bench/torch_train.py says how.
//
// With --device cuda:0 both sides train on the GPU (each batch copied there from the host,
// as a DataLoader user does), one thread, and the GEMM peak columns are left out
// (bench/cuda_gemm.cpp measures GPU GEMMs).
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "child_process.h"
#include "lockstep/core/allocator.h"
#include "lockstep/core/autocast.h"
#include "lockstep/core/device.h"
#include "lockstep/core/parallel.h"
#include "lockstep/data/dataloader.h"
#include "lockstep/data/fashion_mnist.h"
#include "lockstep/data/text_dataset.h"
#include "lockstep/nn/gpt.h"
#include "lockstep/nn/models.h"
#include "lockstep/ops/cpu/gemm.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/optim/sgd.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using bench::ChildResult;
using bench::run_child;
using Clock = std::chrono::steady_clock;

// The image models' recipe.
constexpr int64_t kBatch = 256;
constexpr double kLr = 0.05;
constexpr double kMomentum = 0.9;
// The GPT's: `lockstep train --model gpt`'s global batch, learning rate and weight decay
// (src/tools/train/train_options.h), taken as one batch (no micro-batches) at a constant rate
// (its cosine schedule changes no step's work).
constexpr int64_t kGptBatch = 32;
constexpr double kGptLr = 1e-3;
constexpr double kGptWeightDecay = 0.0;
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
  int64_t batch = 0;              // 0: each model's (kBatch images, kGptBatch windows)
  // The GPT's shape: a preset, each part overridable (0: the preset's), as `lockstep train`.
  std::string preset = "tiny";
  int64_t context = 0, layers = 0, heads = 0, width = 0;
  std::string text;        // the GPT's text: a file split as `lockstep train --data FILE`; "": the fortunes
  std::string train_text;  // a worker's: the training split's bytes, written by the parent, read as is
  // Extra environment for every child, e.g. OMP_WAIT_POLICY=passive.
  std::vector<std::pair<std::string, std::string>> env;
};

// Sized so the whole program takes a minute or two on a 2-core machine.
int64_t default_steps(const std::string& model) { return model == "mlp" ? 80 : 30; }

int64_t batch_size(const std::string& model, const Options& options) {
  if (options.batch > 0) return options.batch;
  return model == "gpt" ? kGptBatch : kBatch;
}

nn::GptConfig gpt_config(const Options& options) {
  nn::GptConfig config = nn::gpt_preset(options.preset);
  if (options.context > 0) config.context = options.context;
  if (options.layers > 0) config.layers = options.layers;
  if (options.heads > 0) config.heads = options.heads;
  if (options.width > 0) config.width = options.width;
  nn::check_gpt_config(config);
  return config;
}

// Tokens in one sample: a GPT's window, or 0 for an image.
int64_t tokens_per_sample(const std::string& model, const Options& options) {
  return model == "gpt" ? gpt_config(options).context : 0;
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// ---------------------------------------------------------------- analytic FLOPs per sample
// Forward: 2 FLOPs per multiply-accumulate of the conv, linear and attention products.
// Backward: the gradients of both operands of each product (as many MACs each as the
// forward), except the input gradient of an image model's first layer (the image needs
// none). Elementwise work (bias, ReLU, pooling, softmax, layer norm, the optimizer) is left
// out: it is small beside the GEMMs.
struct Layer {
  std::string name;
  double macs;  // per sample
  bool input_gradient = true;
};

// The GPT's products for one window of T tokens: per block the four linear layers and the two
// attention products over the whole T x T square (the mask is added after, so nothing is
// skipped), then the head tied to wte.
std::vector<Layer> gpt_layers(const nn::GptConfig& c) {
  const double t = static_cast<double>(c.context), w = static_cast<double>(c.width);
  std::vector<Layer> layers;
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string block = "h." + std::to_string(i) + ".";
    layers.push_back({block + "attn.c_attn", t * w * 3 * w});
    layers.push_back({block + "attn.q_k", t * t * w});
    layers.push_back({block + "attn.p_v", t * t * w});
    layers.push_back({block + "attn.c_proj", t * w * w});
    layers.push_back({block + "mlp.c_fc", t * w * 4 * w});
    layers.push_back({block + "mlp.c_proj", t * 4 * w * w});
  }
  layers.push_back({"head (wte)", t * w * static_cast<double>(c.vocab)});
  return layers;
}

std::vector<Layer> gemm_layers(const std::string& model, const Options& options) {
  if (model == "gpt") return gpt_layers(gpt_config(options));
  if (model == "cnn") {
    // 28 -conv3-> 26 -pool-> 13 -conv3-> 11 -pool-> 5
    return {{"conv1", 32.0 * 26 * 26 * (1 * 9), false},
            {"conv2", 64.0 * 11 * 11 * (32 * 9)},
            {"fc1", 1600.0 * 128},
            {"fc2", 128.0 * 10}};
  }
  if (model == "resnet") {
    // 28x28 (stem, layer1) -> 14x14 (layer2) -> 7x7 (layer3), two blocks each; 3x3 convs,
    // 1x1 downsamples in the first block of layer2 and layer3
    return {{"conv1", 16.0 * 28 * 28 * (1 * 9), false},    {"layer1.0.conv1", 16.0 * 28 * 28 * (16 * 9)},
            {"layer1.0.conv2", 16.0 * 28 * 28 * (16 * 9)}, {"layer1.1.conv1", 16.0 * 28 * 28 * (16 * 9)},
            {"layer1.1.conv2", 16.0 * 28 * 28 * (16 * 9)}, {"layer2.0.conv1", 32.0 * 14 * 14 * (16 * 9)},
            {"layer2.0.conv2", 32.0 * 14 * 14 * (32 * 9)}, {"layer2.0.downsample", 32.0 * 14 * 14 * 16},
            {"layer2.1.conv1", 32.0 * 14 * 14 * (32 * 9)}, {"layer2.1.conv2", 32.0 * 14 * 14 * (32 * 9)},
            {"layer3.0.conv1", 64.0 * 7 * 7 * (32 * 9)},   {"layer3.0.conv2", 64.0 * 7 * 7 * (64 * 9)},
            {"layer3.0.downsample", 64.0 * 7 * 7 * 32},    {"layer3.1.conv1", 64.0 * 7 * 7 * (64 * 9)},
            {"layer3.1.conv2", 64.0 * 7 * 7 * (64 * 9)},   {"fc", 64.0 * 10}};
  }
  return {{"fc1", 784.0 * 512, false}, {"fc2", 512.0 * 512}, {"fc3", 512.0 * 10}};
}

struct Flops {
  double forward = 0, backward = 0;
  double total() const { return forward + backward; }
};

Flops flops_per_sample(const std::string& model, const Options& options) {
  Flops f;
  for (const Layer& layer : gemm_layers(model, options)) {
    f.forward += 2 * layer.macs;
    f.backward += 2 * layer.macs * (layer.input_gradient ? 2 : 1);
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

// What one model trains on and with: its data set (the input and target fields of a batch),
// the model on its device, its optimizer and its loss.
struct Workload {
  std::shared_ptr<const Dataset> train_set;
  std::string input, target;
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::function<Tensor(const Tensor& output, const Tensor& target)> loss;
};

Workload make_workload(const std::string& model_name, const Device& device, const Options& options) {
  Workload w;
  if (model_name == "gpt") {
    const nn::GptConfig config = gpt_config(options);
    if (options.train_text.empty()) throw std::invalid_argument("a gpt worker needs --train-text FILE");
    w.train_set = std::make_shared<TensorDataset>(text_windows(read_text_file(options.train_text), config.context));
    w.input = kTokensField;
    w.target = kTargetsField;
    w.model = std::make_shared<nn::Gpt>(config, 0);
    w.loss = [](const Tensor& logits, const Tensor& targets) { return nn::gpt_loss(logits, targets); };
  } else {
    w.train_set = std::make_shared<TensorDataset>(load_fashion_mnist(options.data, Split::train));
    w.input = kImageField;
    w.target = kLabelField;
    w.model = nn::make_model(model_name, 0);
    w.loss = [](const Tensor& logits, const Tensor& labels) { return cross_entropy(logits, labels); };
  }
  w.model->to(device);  // before the optimizer takes its parameters
  if (model_name == "gpt") {
    w.optimizer = std::make_unique<optim::AdamW>(w.model->parameters(),
                                                 optim::AdamWOptions{.lr = kGptLr, .weight_decay = kGptWeightDecay});
  } else {
    w.optimizer =
        std::make_unique<optim::SGD>(w.model->parameters(), optim::SGDOptions{.lr = kLr, .momentum = kMomentum});
  }
  return w;
}

int train_worker(const std::string& model_name, int threads, int64_t steps, const Options& options) {
  set_num_threads(threads);
  const Device device = Device::parse(options.device);
  Workload work = make_workload(model_name, device, options);
  const int64_t batch = batch_size(model_name, options);
  DataLoader loader(work.train_set, {.batch_size = batch, .shuffle = true, .seed = 0, .drop_last = true});

  // Seconds per phase, summed over the timed steps.
  double data_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0, loss = 0;
  auto step = [&](bool timed) {
    auto t0 = Clock::now();
    std::optional<Batch> batch = loader.next();
    if (!batch) batch = loader.next();  // next epoch
    auto t1 = Clock::now();
    const Tensor inputs = batch->samples[work.input].to(device), targets = batch->samples[work.target].to(device);
    const AutocastGuard autocast(parse_dtype(options.precision));
    Tensor loss_tensor = work.loss(work.model->forward(inputs), targets);
    auto t2 = Clock::now();
    loss_tensor.backward();
    auto t3 = Clock::now();
    work.optimizer->step();
    work.optimizer->zero_grad();
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
    rates.push_back(static_cast<double>(steps * batch) / elapsed);
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
// A file of our own in the temporary directory, removed when this goes out of scope.
struct TemporaryFile {
  std::string path;
  TemporaryFile() {
    std::string name = (fs::temp_directory_path() / "train_throughput_text_XXXXXX").string();
    const int fd = mkstemp(name.data());
    if (fd < 0) throw std::runtime_error("cannot create a temporary file in " + fs::temp_directory_path().string());
    close(fd);
    path = name;
  }
  ~TemporaryFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  void write(const std::string& bytes) const {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error("cannot write the temporary file " + path);
  }
};

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

  const bool has_gpt = std::find(options.models.begin(), options.models.end(), "gpt") != options.models.end();
  const bool has_images =
      std::any_of(options.models.begin(), options.models.end(), [](const std::string& m) { return m != "gpt"; });
  // Both sides read the GPT's training split from one file the parent writes, so they train on
  // the same bytes without a second copy of the split's rules in Python.
  std::optional<TemporaryFile> text_file;
  if (has_gpt) text_file.emplace();
  if (has_images) {
    std::printf(
        "train_throughput: cnn, mlp, resnet: batch %lld, SGD lr %g momentum %g, Fashion-MNIST train (%s), "
        "shuffled\n",
        static_cast<long long>(batch_size("cnn", options)), kLr, kMomentum, options.data.c_str());
  }
  if (has_gpt) {
    const nn::GptConfig c = gpt_config(options);
    const std::string train = load_text(options.text).train;
    text_file->write(train);
    std::printf(
        "train_throughput: gpt %s (context %lld, %lld layers, %lld heads, width %lld, %.2f M parameters): batch %lld "
        "windows = %lld tokens per step, AdamW lr %g weight decay %g, one batch a step (no micro-batches), the "
        "training split of %s (%zu bytes, %lld windows), shuffled\n",
        options.preset.c_str(), static_cast<long long>(c.context), static_cast<long long>(c.layers),
        static_cast<long long>(c.heads), static_cast<long long>(c.width), nn::gpt_parameter_count(c) / 1e6,
        static_cast<long long>(batch_size("gpt", options)),
        static_cast<long long>(batch_size("gpt", options) * c.context), kGptLr, kGptWeightDecay,
        options.text.empty() ? "the fortunes" : options.text.c_str(), train.size(),
        static_cast<long long>(text_window_count(static_cast<int64_t>(train.size()), c.context)));
  }
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
    const Flops f = flops_per_sample(model, options);
    std::printf("FLOPs/sample %s: %.2f M forward + %.2f M backward = %.2f M (%s)\n", model.c_str(), f.forward / 1e6,
                f.backward / 1e6, f.total() / 1e6,
                model == "gpt" ? "linear, attention and head products only; a sample is one window"
                               : "conv/linear GEMMs only; the first layer's input gradient is not computed");
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
      std::vector<std::string> common = {"--model",     model,
                                         "--threads",   std::to_string(threads),
                                         "--steps",     std::to_string(steps),
                                         "--warmup",    std::to_string(options.warmup),
                                         "--reps",      std::to_string(options.reps),
                                         "--data",      options.data,
                                         "--device",    options.device,
                                         "--precision", options.precision,
                                         "--batch",     std::to_string(batch_size(model, options))};
      if (model == "gpt") {  // the resolved shape, so the Python side needs no table of presets
        const nn::GptConfig c = gpt_config(options);
        common.insert(common.end(),
                      {"--context", std::to_string(c.context), "--layers", std::to_string(c.layers), "--heads",
                       std::to_string(c.heads), "--width", std::to_string(c.width), "--train-text", text_file->path});
      }
      std::vector<std::string> ours = {self, "--worker"};
      ours.insert(ours.end(), common.begin(), common.end());
      Row row{model, threads, steps, run_child(ours, child_env(threads, options)), {}, peak};
      if (!row.ours.ok) std::fprintf(stderr, "Lockstep %s run failed: %s\n", model.c_str(), row.ours.failure.c_str());
      if (have_torch) {
        std::vector<std::string> theirs = {options.python, script};
        theirs.insert(theirs.end(), common.begin(), common.end());
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
    const double gflops = ours * flops_per_sample(r.model, options).total() / 1e9;
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
      const double ours = number(r.ours, "samples_per_s"), theirs = number(r.theirs, "samples_per_s");
      std::printf("SUMMARY %s threads=%d device=%s precision=%s ours=%.0f torch=%.0f ratio=%.3f", r.model.c_str(),
                  r.threads, options.device.c_str(), options.precision.c_str(), ours, theirs, ours / theirs);
      const double tokens = static_cast<double>(tokens_per_sample(r.model, options));
      if (tokens > 0) std::printf(" ours_tokens=%.0f torch_tokens=%.0f", ours * tokens, theirs * tokens);
      std::printf("\n");
    }
  }
  if (has_gpt) {
    const double tokens = static_cast<double>(tokens_per_sample("gpt", options));
    std::printf("\ngpt in tokens per second (samples/s x context %.0f):\n", tokens);
    std::printf("%-5s %3s | %12s %12s %6s\n", "model", "thr", "ours tok/s", "torch tok/s", "ratio");
    for (const Row& r : rows) {
      if (r.model != "gpt") continue;
      const double ours = number(r.ours, "samples_per_s") * tokens, theirs = number(r.theirs, "samples_per_s") * tokens;
      std::printf("%-5s %3d | %12s %12s %6s\n", r.model.c_str(), r.threads,
                  r.ours.ok ? fmt("%.0f", ours).c_str() : "failed", r.theirs.ok ? fmt("%.0f", theirs).c_str() : "n/a",
                  r.ours.ok && r.theirs.ok ? fmt("%.2f", ours / theirs).c_str() : "-");
    }
  }
  std::printf(
      "ours/s, torch/s: training samples (an image, or one GPT window) per second; ratio: ours / torch; GF/s from the "
      "FLOPs above; "
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
  std::fprintf(
      stderr,
      "train_throughput: %s\n"
      "usage: train_throughput [--steps N] [--threads 1,2] [--models cnn,mlp,resnet,gpt] [--warmup N] [--reps N]\n"
      "                        [--repo DIR] [--data DIR] [--python PATH] [--env KEY=VALUE,...]\n"
      "                        [--device cpu:0|cuda:0] [--precision f32|bf16|f16] [--batch N]\n"
      "                        [--preset tiny|small|gpt2-124m] [--context N] [--layers N] [--heads N]\n"
      "                        [--width N] [--text FILE]\n"
      "--batch: samples per step (default 256 images, 32 GPT windows); --preset and the shape flags: the\n"
      "GPT's, as lockstep train's; --text: the GPT's text, split as lockstep train --data FILE (default:\n"
      "the fortunes in /usr/share/games/fortunes)\n",
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
      {"--batch", [&](const std::string& v) { options.batch = std::stoll(v); }},
      {"--preset", [&](const std::string& v) { options.preset = v; }},
      {"--context", [&](const std::string& v) { options.context = std::stoll(v); }},
      {"--layers", [&](const std::string& v) { options.layers = std::stoll(v); }},
      {"--heads", [&](const std::string& v) { options.heads = std::stoll(v); }},
      {"--width", [&](const std::string& v) { options.width = std::stoll(v); }},
      {"--text", [&](const std::string& v) { options.text = v; }},
      {"--train-text", [&](const std::string& v) { options.train_text = v; }},
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
  if (options.reps < 1 || options.steps < 0 || options.warmup < 0 || options.batch < 0) {
    return usage_error("--reps must be at least 1 and --steps, --warmup, --batch at least 0");
  }
  if (options.context < 0 || options.layers < 0 || options.heads < 0 || options.width < 0) {
    return usage_error("--context, --layers, --heads and --width must be positive (0: the preset's)");
  }
  if (options.threads.empty()) return usage_error("--threads must list at least one count");
  for (const int t : options.threads) {
    if (t < 1) return usage_error("--threads must list counts of at least 1");
  }
  std::vector<std::string> known = nn::model_names();
  known.push_back("gpt");
  for (const std::string& m : options.models) {
    if (std::find(known.begin(), known.end(), m) == known.end()) return usage_error("unknown model '" + m + "'");
    if (m == "gpt") gpt_config(options);  // a bad preset or shape fails here, before any child runs
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
