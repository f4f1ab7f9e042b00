// The `local` backend: the ranks are threads of one process (one per CPU device), as in
// single-process data parallel. Every rank reads the others' tensors where they lie, so
// nothing is staged or copied twice.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/comm/one_host_communicator.h"

namespace lockstep::comm {

struct LocalGroup;

class LocalCommunicator : public OneHostCommunicator {
 public:
  // One communicator per rank of a new group; give element r to the thread that runs rank r.
  static std::vector<std::shared_ptr<Communicator>> create_group(int size);

  LocalCommunicator(int rank, std::shared_ptr<LocalGroup> group);
  ~LocalCommunicator() override;
  const char* backend() const override { return "local"; }
  // The first rank to ask allocates it; the others get the same tensor.
  Tensor empty_common(const Shape& shape, DType dtype, Device device = Device::cpu()) override;

 protected:
  std::optional<BufferRef> direct_ref(const void* data, size_t bytes) override;
  void* staging(BufferRef* ref) override;
  size_t staging_bytes() const override { return size_t{1} << 62; }
  void* resolve(int peer, const BufferRef& ref) override;
  std::shared_ptr<Communicator> make_subgroup(const std::vector<int>& members, int color,
                                              const CollectiveDesc& desc) override;

 private:
  std::shared_ptr<LocalGroup> group_;
  uint64_t commons_ = 0;  // empty_common calls so far
};

}  // namespace lockstep::comm
