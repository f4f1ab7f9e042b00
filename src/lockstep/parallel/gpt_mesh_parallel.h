// A GPT on a D × T × P device mesh as a Layout (gpt_mesh.h for one rank): either this
// process drives every rank, each a thread on its own device's worker (local_ranks.h: over
// `nccl` when each device is a GPU of its own, else `local`), or it is one rank of a job a
// launcher started, over the world communicator given. The batch's token and target fields ([B, T] each) are named by
// the caller. The full model and the unsharded optimizer state are gathered from the ranks
// (collective) and loaded into any layout, so checkpoints move between meshes and data
// parallelism.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/parallel/gpt_mesh.h"
#include "lockstep/parallel/layout.h"
#include "lockstep/parallel/local_ranks.h"

namespace lockstep::parallel {

struct GptMeshParallelOptions {
  GptMeshOptions mesh;
  std::string tokens = "tokens", targets = "targets";  // the batch's fields
  int threads_per_device = 1;
  // This process's rank of a launched job (its size the mesh's), or null: every rank here.
  std::shared_ptr<comm::Communicator> world = nullptr;
  // The devices of the ranks this process drives, in rank order: every rank's (all here),
  // or this process's one (under a launcher). Empty: cpu:0, cpu:1, ...
  std::vector<Device> devices = {};
};

class GptMeshParallel final : public Layout {
 public:
  // make_model() gives the full model (the same weights at every call); every rank cuts its
  // part from one copy.
  using MakeModel = std::function<std::shared_ptr<nn::Gpt>()>;
  GptMeshParallel(const GptMeshParallelOptions& options, const MakeModel& make_model,
                  const OptimizerFactory& make_optimizer);
  ~GptMeshParallel() override;

  // StepResult::devices: one entry per rank this process drives, in rank order.
  StepResult step(const TensorBatch& global_batch, const StepContext& context) override;
  int64_t micro_batch() const override { return options_.mesh.micro_batch; }
  // The full model, gathered from the ranks each time it is asked for (collective).
  nn::Module& model() override;
  nn::Module* model_on(int root) override;
  void load_model_state(const NamedTensors& state) override;
  void set_lr(double lr) override;
  double lr() const override;
  NamedTensors optimizer_state() override;
  NamedTensors optimizer_state_on(int root) override;
  void load_optimizer_state(const NamedTensors& state) override;
  // The device of each rank this process drives.
  std::vector<Device> local_devices() const override { return devices_; }
  int64_t max_over_processes(int64_t value) override;
  void give_up(const std::string& reason) override;

  const std::vector<std::unique_ptr<GptMeshRank>>& ranks() const { return ranks_; }
  // The mesh's communicator: the launched job's world, or the group of this process's ranks
  // (rank 0's), whose backend() says what carries the step ("nccl", "local", "shm", ...).
  const comm::Communicator& world() const { return *ranks_[0]->mesh().world(); }

 private:
  // task(i) for every rank this process holds, each on its device's worker.
  void run_local(const std::function<void(int)>& task);

  GptMeshParallelOptions options_;
  std::vector<Device> devices_;
  MakeModel make_model_;
  std::unique_ptr<LocalRanks> local_;  // every rank here; null when this process is one rank
  std::vector<std::unique_ptr<GptMeshRank>> ranks_;
  std::shared_ptr<nn::Gpt> gathered_;
  std::shared_ptr<nn::Gpt> gathered_on_root_;  // model_on's, apart: a model() reference stays valid
};

}  // namespace lockstep::parallel
