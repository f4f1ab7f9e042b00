#include "lockstep/comm/device_group.h"

#include <cstdlib>
#include <set>

#include "lockstep/comm/local_communicator.h"
#include "lockstep/comm/store.h"
#include "lockstep/core/cuda_device.h"
#if LOCKSTEP_HAVE_NCCL
#include "lockstep/comm/cuda/nccl_communicator.h"
#endif

namespace lockstep::comm {

std::string device_group_backend(const std::vector<Device>& devices) {
#if LOCKSTEP_HAVE_NCCL
  if (devices.size() < 2 || cuda::devices_per_gpu() != 1) return "local";
  std::set<int> gpus;
  for (const Device& device : devices) {
    if (!device.is_cuda()) return "local";
    gpus.insert(cuda::physical_device(device));
  }
  return gpus.size() == devices.size() ? "nccl" : "local";
#else
  (void)devices;
  return "local";
#endif
}

std::vector<std::shared_ptr<Communicator>> create_device_group(
    const std::vector<Device>& devices, const std::function<void(const std::function<void(int)>&)>& on_each_rank) {
  LOCKSTEP_CHECK(!devices.empty()) << "a group of devices needs at least one device";
  const int size = static_cast<int>(devices.size());
  if (device_group_backend(devices) == "local") return LocalCommunicator::create_group(size);
  std::vector<std::shared_ptr<Communicator>> ranks(devices.size());
#if LOCKSTEP_HAVE_NCCL
  // As init_process_group: NCCL's own reductions only when asked for, the tree order else.
  const char* choice = std::getenv("LOCKSTEP_NCCL_DETERMINISTIC");
  const bool deterministic = !(choice && std::string(choice) == "0");
  auto store = std::make_shared<MemoryStore>();
  on_each_rank([&](int r) {
    const auto at = static_cast<size_t>(r);
    ranks[at] = NcclCommunicator::create(store, "device_group", r, size, cuda::physical_device(devices[at]),
                                         default_timeout(), deterministic);
  });
#else
  (void)on_each_rank;
#endif
  return ranks;
}

}  // namespace lockstep::comm
