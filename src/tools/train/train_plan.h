// `lockstep train` is parse, plan, run, report. The plan is what the run will do, made by
// one pure function from the flags as given, the environment the process starts in (its
// launcher, the GPUs it sees, the host's cores) and the checkpoint it resumes: every
// default settled and every combination checked before anything is built, and nothing
// read from the world inside, so tests make plans for hosts and launchers this one is not.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "lockstep/comm/launch_env.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/nn/gpt.h"
#include "lockstep/parallel/gpt_mesh.h"
#include "tools/train/train_options.h"

namespace lockstep::tools {

struct TrainEnvironment {
  comm::LaunchInfo launch;  // a launched job's rank and world; world_size 1 when started alone
  int visible_gpus = 0;
  int host_cores = 1;
  int64_t host_memory_bytes = 0;  // physical memory; 0 when unknown
  // The metadata of --resume's newest checkpoint (the run loads the newest intact one),
  // and its path; none for a fresh start (also --resume auto in a folder without one).
  std::string checkpoint_path = "";
  std::optional<Metadata> checkpoint = std::nullopt;
  // Where the run writes when neither --out nor --resume names a folder (runs/<timestamp>).
  std::string fresh_out_dir = "";
};

struct TrainPlan {
  // Every flag with its default settled: strategy, devices and their kind, optimizer, lr,
  // micro-batch, backend, threads, the GPT's shape; those a checkpoint fixes taken from it.
  TrainOptions settings;
  nn::GptConfig gpt;              // --model gpt: the shape resolved from --preset and the shape flags
  parallel::GptMeshOptions mesh;  // --strategy mesh
  int processes = 1;              // of the job: ddp, zero1-3 or a launched mesh have one per device
  int rank = 0;
  int local_rank = 0;  // among this host's processes: a ddp rank's GPU is cuda:local_rank
  bool leader = true;  // writes the files and prints the results: rank 0
  int process_threads = 1;
  int threads_per_device = 1;
  int replicas = 1;          // the devices that share the batch: every device, or a mesh's dp
  int64_t accumulation = 1;  // micro-batches per replica per step
  // --offload-optimizer on GPUs; on CPU devices, whose state is in host memory already, the
  // flag does nothing and the run says so (offload_ignored).
  bool offload_optimizer = false;
  bool offload_ignored = false;
  std::string out_dir;
  std::string resume_from;  // the folder whose newest intact checkpoint the run continues; "": a fresh start
  double checkpoint_interval_seconds = 0;

  // The --lr-schedule of a run of total_steps: as given, or the default, whose warm-up
  // depends on the run's length (a schedule without a length spans the run).
  std::string lr_schedule(int64_t total_steps) const;
};

// `given(flag)` says whether the flag was on the command line (a checkpoint's setting
// yields to no default, only to an equal flag). Throws UsageError for what the user can
// fix by flags, Error for a checkpoint that is not a training run's.
TrainPlan plan_training(const TrainOptions& flags, const std::function<bool(const std::string&)>& given,
                        const TrainEnvironment& environment);

}  // namespace lockstep::tools
