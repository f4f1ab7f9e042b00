#include "tools/train/train_strategy.h"

#include "lockstep/comm/init.h"
#include "lockstep/comm/launch_env.h"
#include "lockstep/core/cuda_device.h"
#include "lockstep/core/device.h"
#include "lockstep/ops/ops.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/parallel/distributed_data_parallel.h"
#include "tools/common/flags.h"

namespace lockstep::tools {

int threads_for_process(const TrainOptions& options, int processes_on_host) {
  if (options.threads > 0) return static_cast<int>(options.threads);
  return std::max(1, host_cores() / std::max(1, processes_on_host));
}

std::vector<std::string> cpu_device_names(int first, int count) {
  std::vector<std::string> names;
  for (int d = first; d < first + count; ++d) names.push_back(Device::cpu(d).str());
  return names;
}

std::vector<DeviceTotals> gather_device_totals(comm::Communicator& comm, const DeviceTotals& mine) {
  const parallel::DeviceTimes& t = mine.times;
  constexpr int64_t kFields = 6;
  const Tensor row = Tensor::from_vector(std::vector<double>{t.compute, t.bubble, t.wait, t.communicate, t.optimizer,
                                                             static_cast<double>(mine.peak_bytes)},
                                         {kFields});
  const Tensor all = Tensor::empty({kFields * static_cast<int64_t>(comm.size())}, DType::f64);
  comm.all_gather(row, all);
  const double* v = all.data<double>();
  std::vector<DeviceTotals> out(static_cast<size_t>(comm.size()));
  for (size_t r = 0; r < out.size(); ++r) {
    const double* f = v + kFields * r;
    out[r] = {.times = {.compute = f[0], .wait = f[2], .communicate = f[3], .bubble = f[1], .optimizer = f[4]},
              .peak_bytes = static_cast<int64_t>(f[5])};
  }
  return out;
}

namespace {

void check_layout(const TrainOptions& options) {
  const std::string error =
      parallel::check_step_layout(options.batch_size, options.micro_batch, static_cast<int>(options.devices));
  if (!error.empty()) throw UsageError(error);
}

class DataParallelStrategy final : public TrainStrategy {
 public:
  DataParallelStrategy(const TrainOptions& options, int threads, const parallel::LossFunction& loss,
                       const ReplicaFactory& make_replica, const OptimizerFactory& make_optimizer)
      : threads_(threads),
        dp_(
            {.loss = loss,
             .devices = static_cast<int>(options.devices),
             .device_type = options.device_type,
             .micro_batch = options.micro_batch,
             .threads_per_device = std::max(1, threads / static_cast<int>(options.devices)),
             .precision = parse_dtype(options.precision)},
            [&](int) { return make_replica(); }, make_optimizer) {}

  parallel::StepResult step(const Batch& batch, uint64_t step, uint64_t seed) override {
    return dp_.step(batch.samples, {.seed = seed, .step = step, .first_sample = batch.first_position});
  }
  nn::Module& model() override { return dp_.replica(0); }
  void set_lr(double lr) override { dp_.set_lr(lr); }
  double lr() const override { return dp_.lr(); }
  NamedTensors optimizer_state() override { return dp_.optimizer_state(); }
  int64_t optimizer_state_bytes() const override { return dp_.optimizer_state_bytes(0); }
  RunPosition restore(const Checkpoint& checkpoint, const std::string& path) override {
    const RunPosition position = restore_train_checkpoint(
        checkpoint, path, dp_.replica(0), [&](const NamedTensors& state) { dp_.load_optimizer_state(state); });
    for (int d = 1; d < dp_.devices(); ++d)
      restore_train_checkpoint(checkpoint, path, dp_.replica(d), [](const NamedTensors&) {});
    return position;
  }
  std::vector<std::string> local_devices() const override {
    std::vector<std::string> names;
    for (int d = 0; d < dp_.devices(); ++d) names.push_back(dp_.device(d).str());
    return names;
  }
  std::vector<std::string> all_devices() const override { return local_devices(); }
  std::vector<Device> local_allocators() const override {
    std::vector<Device> devices;
    for (int d = 0; d < dp_.devices(); ++d) devices.push_back(dp_.device(d));
    return devices;
  }
  int threads_per_device() const override { return dp_.threads_per_device(); }
  int process_threads() const override { return threads_; }
  bool leader() const override { return true; }
  std::vector<DeviceTotals> gather(const std::vector<DeviceTotals>& local) override { return local; }

 private:
  int threads_;
  parallel::DataParallel dp_;
};

class DistributedStrategy final : public TrainStrategy {
 public:
  // Each process trains on `device`: a CPU device, or the GPU of its local rank.
  DistributedStrategy(const TrainOptions& options, std::shared_ptr<comm::Communicator> comm, int threads, Device device,
                      const parallel::LossFunction& loss, const ReplicaFactory& make_replica,
                      const OptimizerFactory& make_optimizer)
      : threads_(threads),
        device_(device),
        ddp_(make_ddp(
            options, std::move(comm), loss,
            [&] {
              std::shared_ptr<nn::Module> replica = make_replica();
              replica->to(device);
              return replica;
            },
            make_optimizer)) {}

  parallel::StepResult step(const Batch& batch, uint64_t step, uint64_t seed) override {
    // Every rank loads the global batch in the same order and trains on its share.
    return ddp_->step(batch.samples, {.seed = seed, .step = step, .first_sample = batch.first_position});
  }
  nn::Module& model() override { return ddp_->model(); }
  void set_lr(double lr) override { ddp_->set_lr(lr); }
  double lr() const override { return ddp_->lr(); }
  NamedTensors optimizer_state() override { return ddp_->optimizer_state(); }
  int64_t optimizer_state_bytes() const override { return ddp_->optimizer_state_bytes(); }
  RunPosition restore(const Checkpoint& checkpoint, const std::string& path) override {
    return restore_train_checkpoint(checkpoint, path, ddp_->model(),
                                    [&](const NamedTensors& state) { ddp_->load_optimizer_state(state); });
  }
  std::vector<std::string> local_devices() const override {
    return {Device(device_.type(), ddp_->communicator().rank()).str()};
  }
  std::vector<std::string> all_devices() const override {
    std::vector<std::string> names;
    for (int r = 0; r < ddp_->communicator().size(); ++r) names.push_back(Device(device_.type(), r).str());
    return names;
  }
  std::vector<Device> local_allocators() const override { return {device_}; }
  int threads_per_device() const override { return threads_; }
  int process_threads() const override { return threads_; }
  bool leader() const override { return ddp_->communicator().rank() == 0; }
  std::vector<DeviceTotals> gather(const std::vector<DeviceTotals>& local) override {
    return gather_device_totals(ddp_->communicator(), local.at(0));
  }
  void barrier() override { ddp_->communicator().barrier(); }

 private:
  static std::unique_ptr<parallel::DistributedDataParallel> make_ddp(const TrainOptions& options,
                                                                     std::shared_ptr<comm::Communicator> comm,
                                                                     const parallel::LossFunction& loss,
                                                                     const ReplicaFactory& make_replica,
                                                                     const OptimizerFactory& make_optimizer) {
    const auto bucket_bytes = static_cast<int64_t>(options.bucket_mb * 1024 * 1024);
    return std::make_unique<parallel::DistributedDataParallel>(
        make_replica(), make_optimizer, std::move(comm),
        parallel::DistributedDataParallelOptions{
            .loss = loss,
            .micro_batch = options.micro_batch,
            .bucket_bytes = std::max<int64_t>(1, bucket_bytes),
            .first_bucket_bytes = std::max<int64_t>(1, std::min<int64_t>(bucket_bytes, 1 << 20)),
            .zero1 = options.strategy == "zero1",
            .precision = parse_dtype(options.precision)});
  }

  int threads_;
  Device device_;
  std::unique_ptr<parallel::DistributedDataParallel> ddp_;
};

}  // namespace

std::unique_ptr<TrainStrategy> make_train_strategy(TrainOptions& options, const parallel::LossFunction& loss,
                                                   const ReplicaFactory& make_replica,
                                                   const OptimizerFactory& make_optimizer) {
  if (options.strategy == "dp") {
    if (options.devices == 0) {
      // Every GPU, else every core a device; or as many as can share the step's
      // micro-batches (3 cores and 8 micro-batches: 2 devices).
      options.devices = options.device_type == DeviceType::cuda ? cuda::device_count() : host_cores();
      while (options.devices > 1 &&
             !parallel::check_step_layout(options.batch_size, options.micro_batch, static_cast<int>(options.devices))
                  .empty()) {
        --options.devices;
      }
    }
    check_layout(options);
    const int threads = threads_for_process(options, 1);
    return std::make_unique<DataParallelStrategy>(options, threads, loss, make_replica, make_optimizer);
  }
  if (options.strategy == "ddp" || options.strategy == "zero1") {
    const comm::LaunchInfo launch = comm::launch_info_from_env();
    if (options.devices != 0 && options.devices != launch.world_size) {
      throw UsageError("--strategy " + options.strategy + " trains on one device per process: this job has " +
                       std::to_string(launch.world_size) + " process(es), not --devices " +
                       std::to_string(options.devices) +
                       "; start one process per device (mpirun -n N, torchrun --nproc-per-node N) or leave --devices "
                       "out");
    }
    options.devices = launch.world_size;
    check_layout(options);
    const int threads = threads_for_process(options, launch.local_world_size);
    // On GPUs, rank r's device is cuda:LOCAL_RANK (lockstep run and torchrun make the job's
    // GPUs visible to every rank in rank order), and NCCL carries the gradients.
    Device device = Device::cpu();
    if (options.device_type == DeviceType::cuda) {
      device = Device(DeviceType::cuda, launch.local_rank);
      if (launch.local_rank >= cuda::device_count()) {
        throw UsageError("local rank " + std::to_string(launch.local_rank) + " has no GPU: this process sees " +
                         std::to_string(cuda::device_count()) +
                         " GPU(s); start at most that many processes per host, or add --devices cpu");
      }
      if (options.backend == "auto") options.backend = "nccl";
      if (options.backend != "nccl") {
        throw UsageError("--backend " + options.backend +
                         " moves host memory; GPU training under ddp uses --backend nccl (or add --devices cpu)");
      }
    }
    std::shared_ptr<comm::Communicator> comm = comm::init_process_group(options.backend);
    return std::make_unique<DistributedStrategy>(options, std::move(comm), threads, device, loss, make_replica,
                                                 make_optimizer);
  }
  if (options.strategy == "mesh") return make_mesh_strategy(options, make_replica, make_optimizer);
  throw UsageError(
      "--strategy must be dp (one process drives every device), ddp (one process per device) zero1 (ddp with "
      "the optimizer state sharded) or mesh (a GPT over --dp x --tp x --pp devices), got '" +
      options.strategy + "'");
}

}  // namespace lockstep::tools
