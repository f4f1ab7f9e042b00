// Pipeline parallelism for any nn::Sequential in one process: the D × P ranks of
// sequential_pipeline.h as threads, one per device (cpu:0 .. cpu:D·P-1, or cuda:0 ..), each on
// its own long-lived worker (local_ranks.h: over `nccl` when each device is a GPU of its own,
// else `local`). A Layout like the others,
// so a training loop drives it as it drives DataParallel: the same bits as one device.
// Programs with one process per device build a SequentialPipelineRank themselves.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "lockstep/parallel/layout.h"
#include "lockstep/parallel/local_ranks.h"
#include "lockstep/parallel/sequential_pipeline.h"

namespace lockstep::parallel {

class PipelineParallel final : public Layout {
 public:
  // make_model() must give the same model with the same weights at every call (one copy per
  // rank); make_optimizer an elementwise optimizer over a stage's parameters.
  using MakeModel = std::function<std::shared_ptr<nn::Sequential>()>;
  // Rank r runs on device r of device_type.
  PipelineParallel(const SequentialPipelineOptions& options, const MakeModel& make_model,
                   const OptimizerFactory& make_optimizer, int threads_per_device = 1,
                   DeviceType device_type = DeviceType::cpu);
  ~PipelineParallel() override;

  // StepResult::devices holds one entry per rank, in rank order (rank r: replica r mod D,
  // stage r / D).
  StepResult step(const TensorBatch& global_batch, const StepContext& context) override;
  int64_t micro_batch() const override { return micro_batch_; }
  // The whole model, gathered from the stages into rank 0's copy.
  nn::Module& model() override;
  void load_model_state(const NamedTensors& state) override;
  void set_lr(double lr) override;
  double lr() const override;
  NamedTensors optimizer_state() override;
  void load_optimizer_state(const NamedTensors& state) override;
  std::vector<Device> local_devices() const override { return local_->devices(); }

  int ranks() const { return static_cast<int>(ranks_.size()); }
  SequentialPipelineRank& rank(int r) { return *ranks_.at(static_cast<size_t>(r)); }

 private:
  int64_t micro_batch_;
  std::unique_ptr<LocalRanks> local_;
  std::vector<std::unique_ptr<SequentialPipelineRank>> ranks_;
};

}  // namespace lockstep::parallel
