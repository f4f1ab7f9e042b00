#include "lockstep/comm/shm_communicator.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>

#include "lockstep/comm/env_sizes.h"

namespace lockstep::comm {

// One allocation of every rank, mapped into this process: bases[r] is rank r's part.
struct ShmRegion {
  std::vector<ShmSegment> segments;
  size_t bytes = 0;
  void* base(int rank) const { return segments[rank].data(); }
};

// The regions a communicator and the tensors it handed out share; a tensor's region goes
// when the tensor does, even if the communicator went first.
struct ShmRegionTable {
  std::mutex mutex;
  std::map<uint64_t, std::weak_ptr<ShmRegion>> regions;
  std::shared_ptr<ShmRegion> staging;
};

namespace {

std::string segment_name(const std::string& base, int rank, uint64_t region) {
  return base + "-r" + std::to_string(rank) + "-" + std::to_string(region);
}

// A tensor's segment: whole 64-byte lines, at least one.
size_t segment_bytes(size_t tensor_bytes) { return std::max<size_t>(64, (tensor_bytes + 63) / 64 * 64); }

// Rank 0's random token keeps groups of one host apart; the port (when the job has one)
// tells a person at `ls /dev/shm` which job a segment belongs to.
std::string new_name_base() {
  std::random_device device;
  std::ostringstream name;
  name << "/lockstep-" << getpid() << "-" << std::hex << device() << device();
  return name.str();
}

}  // namespace

std::shared_ptr<ShmCommunicator> ShmCommunicator::create(std::shared_ptr<Store> store, const std::string& prefix,
                                                         int rank, int size, std::chrono::milliseconds timeout) {
  LOCKSTEP_CHECK(size >= 1 && rank >= 0 && rank < size) << "rank " << rank << " is outside a group of " << size;
  const std::string what = "rendezvous of the shm backend (" + prefix + ")";
  const std::vector<std::string> hosts =
      store_all_gather(*store, prefix + "/host", rank, size, host_name(), timeout, what);
  for (int r = 1; r < size; ++r) {
    LOCKSTEP_CHECK(hosts[r] == hosts[0]) << "the shm backend needs every rank on one host, but rank 0 runs on "
                                         << hosts[0] << " and rank " << r << " on " << hosts[r]
                                         << "; use the mpi backend across hosts";
  }
  // Rank 0 keeps the names it made; only the others read them from the store.
  std::string base;
  if (rank == 0) {
    base = new_name_base();
    store->set(prefix + "/names", base);
  } else {
    base = store->get(prefix + "/names", timeout);
  }
  const size_t staging = shm_staging_bytes(env_value("LOCKSTEP_SHM_STAGING_BYTES"));
  const GroupLayout layout(size);
  const std::string control_name = base + "-control";

  // Every name is known to every rank: whoever fails unlinks them all, so nothing is left
  // in /dev/shm however the rendezvous ends.
  auto unlink_all = [&] {
    unlink_segment(control_name);
    for (int r = 0; r < size; ++r) unlink_segment(segment_name(base, r, 0));
  };
  try {
    ShmSegment control;
    if (rank == 0) {
      control = ShmSegment::create(control_name, layout.bytes());
      layout.construct(control.data());
    }
    auto region = std::make_shared<ShmRegion>();
    region->bytes = staging;
    region->segments.resize(size);
    region->segments[rank] = ShmSegment::create(segment_name(base, rank, 0), staging);
    store_all_gather(*store, prefix + "/created", rank, size, "", timeout, what);
    if (rank != 0) control = ShmSegment::open(control_name, layout.bytes());
    for (int r = 0; r < size; ++r) {
      if (r != rank) region->segments[r] = ShmSegment::open(segment_name(base, r, 0), staging);
    }
    layout.slot(control.data(), rank)->pid = getpid();
    store_all_gather(*store, prefix + "/mapped", rank, size, "", timeout, what);
    unlink_segment(segment_name(base, rank, 0));
    if (rank == 0) unlink_segment(control_name);

    std::shared_ptr<ShmCommunicator> comm(
        new ShmCommunicator(rank, size, std::move(control), std::move(store), prefix, base, staging));
    comm->set_timeout(timeout);
    comm->regions_->staging = region;
    comm->regions_->regions[0] = region;
    return comm;
  } catch (...) {
    unlink_all();
    throw;
  }
}

ShmCommunicator::ShmCommunicator(int rank, int size, ShmSegment control, std::shared_ptr<Store> store,
                                 std::string prefix, std::string name_base, size_t staging_bytes)
    : OneHostCommunicator(rank, size, control.data()),
      control_segment_(std::move(control)),
      store_(std::move(store)),
      prefix_(std::move(prefix)),
      name_base_(std::move(name_base)),
      staging_bytes_(staging_bytes),
      regions_(std::make_shared<ShmRegionTable>()) {}

ShmCommunicator::~ShmCommunicator() { leave(); }

std::shared_ptr<ShmRegion> ShmCommunicator::map_region(uint64_t id, size_t bytes) {
  auto region = std::make_shared<ShmRegion>();
  region->bytes = bytes;
  region->segments.resize(size());
  const std::string what = "empty_shared #" + std::to_string(id);
  const std::string key = prefix_ + "/region" + std::to_string(id);
  try {
    region->segments[rank()] = ShmSegment::create(segment_name(name_base_, rank(), id), bytes);
    store_all_gather(*store_, key + "/created", rank(), size(), "", timeout(), what);
    for (int r = 0; r < size(); ++r) {
      if (r != rank()) region->segments[r] = ShmSegment::open(segment_name(name_base_, r, id), bytes);
    }
    store_all_gather(*store_, key + "/mapped", rank(), size(), "", timeout(), what);
  } catch (...) {
    for (int r = 0; r < size(); ++r) unlink_segment(segment_name(name_base_, r, id));
    throw;
  }
  unlink_segment(segment_name(name_base_, rank(), id));
  std::lock_guard lock(regions_->mutex);
  regions_->regions[id] = region;
  return region;
}

Tensor ShmCommunicator::empty_shared(const Shape& shape, DType dtype, Device device) {
  LOCKSTEP_CHECK(device.is_cpu()) << "the shm backend shares host memory; empty_shared on " << device.str()
                                  << " is not possible (use the nccl backend for CUDA tensors)";
  const size_t bytes = static_cast<size_t>(numel(shape)) * dtype_size(dtype);
  const uint64_t id = next_region_++;
  std::shared_ptr<ShmRegion> region = map_region(id, segment_bytes(bytes));
  void* mine = region->base(rank());
  std::weak_ptr<ShmRegionTable> table = regions_;
  auto storage = std::make_shared<Storage>(device, bytes, mine, [region, table, id](void*) mutable {
    if (auto t = table.lock()) {
      std::lock_guard lock(t->mutex);
      t->regions.erase(id);
    }
    region.reset();
  });
  return Tensor::from_storage(std::move(storage), shape, dtype);
}

Tensor ShmCommunicator::empty_common(const Shape& shape, DType dtype, Device device) {
  LOCKSTEP_CHECK(device.is_cpu()) << "the shm backend shares host memory; empty_common on " << device.str()
                                  << " is not possible";
  const size_t bytes = static_cast<size_t>(numel(shape)) * dtype_size(dtype);
  const size_t mapped = segment_bytes(bytes);
  const uint64_t id = next_region_++;
  const std::string what = "empty_common #" + std::to_string(id);
  const std::string key = prefix_ + "/region" + std::to_string(id);
  const std::string name = segment_name(name_base_, 0, id);
  auto segment = std::make_shared<ShmSegment>();
  try {
    if (rank() == 0) *segment = ShmSegment::create(name, mapped);
    store_all_gather(*store_, key + "/created", rank(), size(), "", timeout(), what);
    if (rank() != 0) *segment = ShmSegment::open(name, mapped);
    store_all_gather(*store_, key + "/mapped", rank(), size(), "", timeout(), what);
  } catch (...) {
    unlink_segment(name);
    throw;
  }
  if (rank() == 0) unlink_segment(name);
  void* data = segment->data();
  auto storage = std::make_shared<Storage>(device, bytes, data, [segment](void*) mutable { segment.reset(); });
  return Tensor::from_storage(std::move(storage), shape, dtype);
}

std::optional<BufferRef> ShmCommunicator::direct_ref(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  std::lock_guard lock(regions_->mutex);
  for (const auto& [id, weak] : regions_->regions) {
    if (id == 0) continue;
    std::shared_ptr<ShmRegion> region = weak.lock();
    if (!region) continue;
    const char* base = static_cast<const char*>(region->base(rank()));
    if (p >= base && p + bytes <= base + region->bytes) {
      BufferRef ref;
      ref.region = id;
      ref.offset = static_cast<uint64_t>(p - base);
      return ref;
    }
  }
  return std::nullopt;
}

void* ShmCommunicator::staging(BufferRef* ref) {
  *ref = BufferRef();
  return regions_->staging->base(rank());
}

void* ShmCommunicator::resolve(int peer, const BufferRef& ref) {
  std::shared_ptr<ShmRegion> region;
  {
    std::lock_guard lock(regions_->mutex);
    auto it = regions_->regions.find(ref.region);
    if (it != regions_->regions.end()) region = it->second.lock();
  }
  LOCKSTEP_CHECK(region != nullptr) << "rank " << peer << " posted a buffer in shared region " << ref.region
                                    << " which rank " << rank()
                                    << " no longer holds; every rank must keep its empty_shared tensors alive "
                                       "equally long";
  return static_cast<char*>(region->base(peer)) + ref.offset;
}

// A dead process cannot say so: look it up. A zombie (exited, not yet reaped) is dead too.
void ShmCommunicator::check_alive(int peer, const std::string& call) {
  const int pid = layout_.slot(control_, peer)->pid;
  if (pid <= 0) return;
  bool dead = kill(pid, 0) != 0 && errno == ESRCH;
  if (!dead) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text;
    std::getline(stat, text);
    const size_t paren = text.rfind(')');
    dead = paren != std::string::npos && paren + 2 < text.size() && (text[paren + 2] == 'Z' || text[paren + 2] == 'X');
  }
  if (dead) {
    fail(call + ": rank " + std::to_string(peer) + " (pid " + std::to_string(pid) + ") died; see its log for why");
  }
}

std::shared_ptr<Communicator> ShmCommunicator::make_subgroup(const std::vector<int>& members, int color,
                                                             const CollectiveDesc& desc) {
  if (members.empty()) return nullptr;
  const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
  const std::string prefix = prefix_ + "/split" + std::to_string(desc.sequence) + "/color" + std::to_string(color);
  return create(store_, prefix, new_rank, static_cast<int>(members.size()), timeout());
}

}  // namespace lockstep::comm
