// The `shm` backend: the ranks are processes on one host (one per device, started by
// `lockstep run`, torchrun or mpirun). They meet through a Store, then map each other's
// shared-memory segments and run the same in-place algorithms as threads do. Tensors made
// by empty_shared() are read and written where they lie; others pass through a staging
// segment per rank. Segments are unlinked once every rank has mapped them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lockstep/comm/one_host_communicator.h"
#include "lockstep/comm/shm_segment.h"
#include "lockstep/comm/store.h"

namespace lockstep::comm {

struct ShmRegion;
struct ShmRegionTable;

class ShmCommunicator : public OneHostCommunicator {
 public:
  // Collective over `size` processes that share `store`; prefix names this group's keys
  // in it (several groups may share one store). LOCKSTEP_SHM_STAGING_BYTES sets the
  // staging segment per rank (default 4 MiB).
  static std::shared_ptr<ShmCommunicator> create(std::shared_ptr<Store> store, const std::string& prefix, int rank,
                                                 int size, std::chrono::milliseconds timeout);
  ~ShmCommunicator() override;
  const char* backend() const override { return "shm"; }

  Tensor empty_shared(const Shape& shape, DType dtype, Device device = Device::cpu()) override;
  // Rank 0's segment, mapped by every rank.
  Tensor empty_common(const Shape& shape, DType dtype, Device device = Device::cpu()) override;

 protected:
  std::optional<BufferRef> direct_ref(const void* data, size_t bytes) override;
  void* staging(BufferRef* ref) override;
  size_t staging_bytes() const override { return staging_bytes_; }
  void* resolve(int peer, const BufferRef& ref) override;
  void check_alive(int peer, const std::string& call) override;
  std::shared_ptr<Communicator> make_subgroup(const std::vector<int>& members, int color,
                                              const CollectiveDesc& desc) override;

 private:
  ShmCommunicator(int rank, int size, ShmSegment control, std::shared_ptr<Store> store, std::string prefix,
                  std::string name_base, size_t staging_bytes);
  // Creates this rank's segment for region id, maps every rank's, unlinks its own.
  std::shared_ptr<ShmRegion> map_region(uint64_t id, size_t bytes);

  ShmSegment control_segment_;
  std::shared_ptr<Store> store_;
  std::string prefix_;     // this group's keys in the store
  std::string name_base_;  // "/lockstep-<port>-<token>": this group's segment names
  size_t staging_bytes_;
  std::shared_ptr<ShmRegionTable> regions_;
  uint64_t next_region_ = 1;  // 0 is the staging region
};

}  // namespace lockstep::comm
