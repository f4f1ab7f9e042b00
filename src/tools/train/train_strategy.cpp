#include "tools/train/train_strategy.h"

#include "lockstep/comm/init.h"
#include "lockstep/core/device.h"
#include "lockstep/ops/ops.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/parallel/distributed_data_parallel.h"
#include "tools/common/zero3_units.h"

namespace lockstep::tools {

std::vector<std::string> device_names(DeviceType type, int first, int count) {
  std::vector<std::string> names;
  for (int d = first; d < first + count; ++d) names.push_back(Device(type, d).str());
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

class DataParallelStrategy final : public TrainStrategy {
 public:
  DataParallelStrategy(const TrainPlan& plan, const parallel::LossFunction& loss, const ReplicaFactory& make_replica,
                       const OptimizerFactory& make_optimizer)
      : dp_(
            {.loss = loss,
             .devices = static_cast<int>(plan.settings.devices),
             .device_type = plan.settings.device_type,
             .micro_batch = plan.settings.micro_batch,
             .threads_per_device = plan.threads_per_device,
             .precision = parse_dtype(plan.settings.precision)},
            [&](int) { return make_replica(); }, make_optimizer) {}

  parallel::Layout& layout() override { return dp_; }
  int64_t optimizer_state_bytes() const override { return dp_.optimizer_state_bytes(0); }
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
  std::vector<DeviceTotals> gather(const std::vector<DeviceTotals>& local) override { return local; }

 private:
  parallel::DataParallel dp_;
};

class DistributedStrategy final : public TrainStrategy {
 public:
  // Each process trains on `device`: a CPU device, or the GPU of its local rank.
  DistributedStrategy(const TrainOptions& options, std::shared_ptr<comm::Communicator> comm, Device device,
                      const parallel::LossFunction& loss, const ReplicaFactory& make_replica,
                      const OptimizerFactory& make_optimizer)
      : device_(device),
        ddp_(make_ddp(
            options, std::move(comm), loss,
            [&] {
              std::shared_ptr<nn::Module> replica = make_replica();
              replica->to(device);
              return replica;
            },
            make_optimizer)) {}

  // Every rank loads the global batch in the same order and trains on its share.
  parallel::Layout& layout() override { return *ddp_; }
  int64_t optimizer_state_bytes() const override { return ddp_->optimizer_state_bytes(); }
  std::vector<std::string> local_devices() const override {
    return device_names(device_.type(), ddp_->communicator().rank(), 1);
  }
  std::vector<std::string> all_devices() const override {
    return device_names(device_.type(), 0, ddp_->communicator().size());
  }
  std::vector<Device> local_allocators() const override { return {device_}; }
  std::vector<DeviceTotals> gather(const std::vector<DeviceTotals>& local) override {
    return gather_device_totals(ddp_->communicator(), local.at(0));
  }
  void barrier() override { ddp_->communicator().barrier(); }
  nlohmann::json collectives_json() const override {
    comm::Communicator& comm = ddp_->communicator();
    return {{"backend", comm.backend()}, {"route", comm.route()}};
  }

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
            .zero_stage = options.strategy == "zero3"   ? 3
                          : options.strategy == "zero2" ? 2
                          : options.strategy == "zero1" ? 1
                                                        : 0,
            .zero3_unit_types = zero3_unit_types(options.model),
            .precision = parse_dtype(options.precision),
            .gradient_dtype = parse_dtype(options.grad_dtype),
            .sync_every = options.sync_every,
            .powersgd_rank = static_cast<int>(options.powersgd_rank),
            .powersgd_start_step = options.powersgd_start});
  }

  Device device_;
  std::unique_ptr<parallel::DistributedDataParallel> ddp_;
};

}  // namespace

std::unique_ptr<TrainStrategy> make_train_strategy(const TrainPlan& plan, const parallel::LossFunction& loss,
                                                   const ReplicaFactory& make_replica,
                                                   const OptimizerFactory& make_optimizer) {
  const TrainOptions& settings = plan.settings;
  if (settings.strategy == "dp")
    return std::make_unique<DataParallelStrategy>(plan, loss, make_replica, make_optimizer);
  if (settings.strategy == "mesh") return make_mesh_strategy(plan, make_replica, make_optimizer);
  const Device device =
      settings.device_type == DeviceType::cuda ? Device(DeviceType::cuda, plan.local_rank) : Device::cpu();
  return std::make_unique<DistributedStrategy>(settings, comm::init_process_group(settings.backend), device, loss,
                                               make_replica, make_optimizer);
}

}  // namespace lockstep::tools
