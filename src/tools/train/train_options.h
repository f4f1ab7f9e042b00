// What `lockstep train` was asked to do, after flag parsing and defaults.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "lockstep/core/device.h"

namespace lockstep::tools {

struct TrainOptions {
  std::string model = "cnn";
  // --model gpt: a preset's shape, each part overridable (0: the preset's), and the sample
  // generated at the end.
  std::string preset = "tiny";
  int64_t layers = 0, heads = 0, width = 0, context = 0;
  bool checkpoint_activations = false;
  int64_t sample_bytes = 200;
  double temperature = 0.8;
  int64_t epochs = 1;
  int64_t steps = -1;        // -1: epochs × batches per epoch; 0: evaluate only
  int64_t batch_size = 32;   // the global batch: every device's samples of one step
  int64_t micro_batch = -1;  // -1: default_micro_batch(batch_size)
  // --micro-batch auto: micro_batch is the plan's pick, halved when a step runs out of memory.
  bool micro_batch_auto = false;
  std::string precision = "f32";  // f32, or on GPUs bf16 / f16 matrix products (f16 with a loss scale)
  std::string devices_flag;       // --devices as given: a count, cpu, cuda or a list (train_devices.h)
  int64_t devices = 0;            // 0: every local device (each GPU, else one CPU device per core); ddp: the world size
  DeviceType device_type = DeviceType::cpu;  // CUDA when a GPU is visible, unless --devices says otherwise
  std::string strategy = "dp";               // "mesh" when --dp, --tp or --pp is given
  // --strategy mesh (GPT only): data-parallel replicas x tensor-parallel ranks x pipeline
  // stages, one thread-driven device each (0: --dp from --devices, else 1).
  int64_t dp = 0, tp = 1, pp = 1;
  std::string schedule = "1f1b";   // gpipe | 1f1b
  std::string stages;              // blocks per pipeline stage, "3,1"; "": balanced
  std::string backend = "auto";    // ddp's communicator
  double bucket_mb = 25;           // ddp's gradient bucket size
  std::string grad_dtype = "f32";  // ddp: what gradients cross between processes in (f32, bf16)
  int64_t sync_every = 1;          // ddp: local SGD's steps between averagings (1: every step's gradients)
  int64_t powersgd_rank = 0;       // ddp: PowerSGD's approximation rank (0: off)
  int64_t powersgd_start = 10;     // ddp: the step PowerSGD starts at (plain all-reduces before)
  bool offload_optimizer = false;  // GPUs: the optimizer state in host memory, stepped there
  double lr = -1;                  // -1: default_lr(model, optimizer)
  std::string optimizer;           // "": adamw
  double momentum = 0.9;
  double weight_decay = 0.0;
  double label_smoothing = -1;  // -1: default_label_smoothing(model)
  std::string lr_schedule;      // "": default_lr_schedule(model, steps)
  uint64_t seed = 0;
  int64_t threads = 0;  // in all, shared by the devices; 0: every core
  std::string data_dir;
  std::string out_dir;
  std::string resume_dir;  // a run's folder, or "auto": --out's, when it has a checkpoint
  std::string init_file;
  int64_t checkpoint_every = 0;     // steps between checkpoints while training; 0: none
  std::string checkpoint_interval;  // a duration between checkpoints ("10m"); "": none
  int64_t keep_checkpoints = 2;
  int64_t stop_after = -1;  // stop after this step of the run, with a checkpoint; -1: at the end
  int64_t log_every = 50;
  std::string trace_file;
  bool quiet = false;
};

// The micro-batch used when --micro-batch is not given: an eighth of the batch where it
// divides, so 1, 2, 4 and 8 devices can share the same step without changing its bits
// (the answer depends on the micro-batch, never on the device count). The ResNet's
// BatchNorm normalizes each micro-batch by its own statistics, and few samples make poor
// statistics (one epoch of PyTorch, one block per stage: 0.892 normalizing all 32, 0.887
// normalizing 4 at a time), so it takes half the batch: two devices share a step.
inline int64_t default_micro_batch(const std::string& model, int64_t batch_size) {
  if (model == "resnet") return batch_size % 2 == 0 ? batch_size / 2 : batch_size;
  return batch_size % 8 == 0 ? batch_size / 8 : batch_size;
}

// The recipe where the flags are silent: AdamW, with 100 warm-up steps before the cosine
// decay for the Fashion-MNIST models. One epoch of the CNN at batch 32 reaches 0.88 that
// way (SGD with momentum reached 0.857-0.875 over learning rates 0.02-0.1). The ResNet's
// BatchNorm takes a higher rate (seeds 0-2: 0.9066, 0.9045, 0.9097 at 0.006; 0.9039,
// 0.9060, 0.9046 at 0.004). The GPT learns at the lower rate transformers want.
inline const char* kDefaultOptimizer = "adamw";
inline double default_lr(const std::string& model, const std::string& optimizer) {
  if (optimizer == "sgd") return 0.05;
  if (model == "gpt") return 1e-3;
  return model == "resnet" ? 6e-3 : 4e-3;
}
// Label smoothing of the classification loss (PyTorch's label_smoothing): 0.1 for the
// ResNet, as torchvision's ResNet recipes (one epoch of PyTorch: 0.9058 with it, 0.9007
// without, two blocks per stage), none for the others.
inline double default_label_smoothing(const std::string& model) { return model == "resnet" ? 0.1 : 0.0; }
// Warm-up is at most a tenth of the run, so a short run (--steps 20) still has a schedule.
inline std::string default_lr_schedule(const std::string& model, int64_t total_steps) {
  if (model == "gpt") return "cosine";
  return "cosine:warmup=" + std::to_string(std::min<int64_t>(100, total_steps / 10));
}

}  // namespace lockstep::tools
