// The ranks of one process, one per device, each a thread: what the layouts that drive
// several devices from one process (the GPT mesh, a Sequential's pipeline) talk over.
// Over `nccl` when every device is a GPU of its own — the fast path, reduced in the tree
// order as every backend is — else over `local`: CPU devices, and logical CUDA devices that
// share a GPU (LOCKSTEP_CUDA_DEVICES_PER_GPU; NCCL allows one rank per GPU), whose tensors
// the calls stage through host memory (staged_tensor.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/comm/communicator.h"

namespace lockstep::comm {

// "nccl" or "local": the backend create_device_group picks for these devices.
std::string device_group_backend(const std::vector<Device>& devices);

// One communicator per device, rank r for devices[r]. on_each_rank(task) must run task(r)
// for every rank at once, each on its own thread (NCCL's ranks meet at a rendezvous), and
// return when all have; ranks then use their communicators from those threads.
std::vector<std::shared_ptr<Communicator>> create_device_group(
    const std::vector<Device>& devices, const std::function<void(const std::function<void(int)>&)>& on_each_rank);

}  // namespace lockstep::comm
