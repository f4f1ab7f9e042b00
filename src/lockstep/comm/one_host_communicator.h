// The collectives of ranks that can read and write each other's memory: threads of one
// process (local backend) or processes that map each other's shared-memory segments (shm
// backend). All reductions are tree_reduce's order; each collective costs two barriers.
//
// all_reduce of S bytes over N ranks: below kDirectAllReduceBytes each rank folds the
// whole buffer from every peer (N·S reads per rank, few synchronizations); above it, rank r
// folds slice r from every peer and writes the result into every peer's buffer (N·S bytes
// read and N·S written in all: the memory-bandwidth limit).
#pragma once

#include <optional>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/comm/group_layout.h"

namespace lockstep::comm {

// Where all_reduce switches from every rank folding everything to one slice per rank
// (measured by `lockstep bench collectives`; see docs/architecture.md). The environment
// variable LOCKSTEP_DIRECT_ALLREDUCE_BYTES overrides it, to measure the crossover again.
constexpr size_t kDirectAllReduceBytes = 512;

class OneHostCommunicator : public Communicator {
 public:
  ~OneHostCommunicator() override;

  // The all_reduce size (bytes) up to which every rank folds the whole buffer. Every rank
  // of the group must use the same value.
  void set_direct_all_reduce_bytes(size_t bytes) { direct_bytes_ = bytes; }
  bool shares_memory() const override { return true; }  // host memory: empty_common

 protected:
  // control: the group's control block, laid out by GroupLayout(size) and already
  // constructed. The subclass keeps its memory alive at least as long as this object.
  OneHostCommunicator(int rank, int size, void* control);

  void abort_peers(const std::string& reason) override { mark(RankState::failed, reason); }

  // How peers reach [data, data + bytes): a reference when they can read it directly.
  virtual std::optional<BufferRef> direct_ref(const void* data, size_t bytes) = 0;
  // This rank's staging area (for buffers peers cannot reach) and its reference.
  virtual void* staging(BufferRef* ref) = 0;
  // Staging capacity; collectives proceed in pieces of at most this many bytes. The same
  // on every rank.
  virtual size_t staging_bytes() const = 0;
  // The address, in this process, of a buffer a peer posted.
  virtual void* resolve(int peer, const BufferRef& ref) = 0;
  // Throws CommError if peer is known to be gone (a dead process); called while waiting.
  virtual void check_alive(int /*peer*/, const std::string& /*call*/) {}
  // The new group for `members` (old ranks, in new rank order; empty when this rank passed
  // a negative color). Called by every rank after the split's first barrier; every rank
  // must make the same number of arrive_and_wait calls in it.
  virtual std::shared_ptr<Communicator> make_subgroup(const std::vector<int>& members, int color,
                                                      const CollectiveDesc& desc) = 0;

  // One barrier of the whole group, posting `post` for the others to read afterwards.
  void arrive_and_wait(const Post& post);
  const Post& post_of(int peer) const;  // what peer posted at the last barrier
  // Subclass destructors call this first, while the control block is still mapped: drains
  // the async queue and tells peers this rank is gone.
  void leave();
  // Marks this rank as gone (left or failed) so peers stop waiting for it at once.
  void mark(RankState state, const std::string& why = "");

  [[noreturn]] void fail(const std::string& message);

  GroupLayout layout_;
  void* control_;

 private:
  void do_all_reduce(const Tensor& tensor, const CollectiveDesc& desc) override;
  void do_reduce_scatter(const Tensor& input, const Tensor& output, const CollectiveDesc& desc) override;
  void do_all_gather(const Tensor& input, const Tensor& output, const CollectiveDesc& desc) override;
  void do_broadcast(const Tensor& tensor, const CollectiveDesc& desc) override;
  void do_send(const Tensor& tensor, int peer, int tag) override;
  void do_recv(const Tensor& tensor, int peer, int tag) override;
  void do_barrier(const CollectiveDesc& desc) override;
  std::shared_ptr<Communicator> do_split(int color, int key, const CollectiveDesc& desc) override;

  // Enters a collective: posts desc and buffer, waits for all, checks that they agree.
  void enter(const CollectiveDesc& desc, const BufferRef& buffer, bool first_piece);
  // Publishes [data, data + bytes): directly, or through staging (copying it in when
  // copy_in). Returns where peers will read and write it in this process.
  char* publish(char* data, size_t bytes, bool copy_in, BufferRef* ref);
  size_t piece_elements(DType dtype, int64_t per_element_multiple) const;
  // Waits until ready(), failing fast if peer is gone and at the timeout (naming the ranks
  // missing() lists, or peer); call() says what this rank is doing, for the error.
  template <typename Ready, typename Call>
  void wait_for(Ready ready, int peer, Call call, const std::function<std::vector<int>()>& missing);

  RankSlot* slot(int r) const { return layout_.slot(control_, r); }

  uint64_t generation_ = 0;      // barriers so far (collectives lane only)
  CollectiveDesc current_desc_;  // the collective in progress, for error messages
  // Kept between calls so that small collectives do not allocate.
  std::vector<CollectiveDesc> descs_;
  std::vector<void*> peer_buffers_;
  std::vector<char> result_;
  std::atomic<bool> marked_{false};
  size_t direct_bytes_;
};

}  // namespace lockstep::comm
