#include "lockstep/comm/local_communicator.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

namespace lockstep::comm {

// The memory the ranks of one local group share: the control block, and the subgroups a
// split is handing from the rank that made them to the others.
struct LocalGroup {
  explicit LocalGroup(int size) : size(size), layout(size) {
    const size_t bytes = (layout.bytes() + 63) / 64 * 64;
    control = std::aligned_alloc(64, bytes);
    LOCKSTEP_CHECK(control != nullptr) << "cannot allocate " << bytes << " bytes for a local group of " << size;
    layout.construct(control);
  }
  ~LocalGroup() { std::free(control); }
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int size;
  GroupLayout layout;
  void* control;

  struct Handoff {
    std::shared_ptr<LocalGroup> group;
    int waiting = 0;  // members that have not taken it yet
  };
  std::mutex mutex;
  std::map<std::pair<uint64_t, int>, Handoff> handoffs;  // by (split sequence, color)

  struct Common {
    Tensor tensor;
    int taken = 0;  // ranks that have it
  };
  std::map<uint64_t, Common> commons;  // by call number
};

std::vector<std::shared_ptr<Communicator>> LocalCommunicator::create_group(int size) {
  LOCKSTEP_CHECK(size >= 1) << "a local group needs at least one rank, got " << size;
  auto group = std::make_shared<LocalGroup>(size);
  std::vector<std::shared_ptr<Communicator>> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(std::make_shared<LocalCommunicator>(r, group));
  return ranks;
}

LocalCommunicator::LocalCommunicator(int rank, std::shared_ptr<LocalGroup> group)
    : OneHostCommunicator(rank, group->size, group->control), group_(std::move(group)) {}

LocalCommunicator::~LocalCommunicator() { leave(); }

Tensor LocalCommunicator::empty_common(const Shape& shape, DType dtype, Device device) {
  const uint64_t call = commons_++;
  std::lock_guard lock(group_->mutex);
  LocalGroup::Common& common = group_->commons[call];
  if (!common.tensor.defined()) common.tensor = Tensor::zeros(shape, dtype, device);
  LOCKSTEP_CHECK(common.tensor.shape() == shape && common.tensor.dtype() == dtype)
      << "empty_common #" << call << ": rank " << rank() << " asked for " << shape_str(shape) << " "
      << dtype_name(dtype) << ", another rank for " << shape_str(common.tensor.shape()) << " "
      << dtype_name(common.tensor.dtype()) << ": every rank must ask for the same";
  Tensor tensor = common.tensor;
  if (++common.taken == size()) group_->commons.erase(call);
  return tensor;
}

std::optional<BufferRef> LocalCommunicator::direct_ref(const void* data, size_t /*bytes*/) {
  BufferRef ref;
  ref.offset = reinterpret_cast<uintptr_t>(data);
  return ref;
}

void* LocalCommunicator::staging(BufferRef* /*ref*/) {
  LOCKSTEP_FAIL() << "the local backend reads buffers directly and has no staging area";
  return nullptr;
}

void* LocalCommunicator::resolve(int /*peer*/, const BufferRef& ref) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(ref.offset));
}

std::shared_ptr<Communicator> LocalCommunicator::make_subgroup(const std::vector<int>& members, int color,
                                                               const CollectiveDesc& desc) {
  const auto key = std::make_pair(desc.sequence, color);
  const bool leader = !members.empty() && members.front() == rank();
  if (leader) {
    std::lock_guard lock(group_->mutex);
    group_->handoffs[key] = {std::make_shared<LocalGroup>(static_cast<int>(members.size())),
                             static_cast<int>(members.size())};
  }
  arrive_and_wait(Post());  // every leader has published its group
  if (members.empty()) return nullptr;
  const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
  std::shared_ptr<LocalGroup> subgroup;
  {
    std::lock_guard lock(group_->mutex);
    auto it = group_->handoffs.find(key);
    subgroup = it->second.group;
    if (--it->second.waiting == 0) group_->handoffs.erase(it);
  }
  return std::make_shared<LocalCommunicator>(new_rank, std::move(subgroup));
}

}  // namespace lockstep::comm
