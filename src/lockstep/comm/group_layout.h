// The control block of a one-host group: what ranks that can address each other's memory
// (threads of one process, or processes mapping one shared-memory segment) use to meet.
// Each rank owns a slot on its own cache lines; each ordered pair of ranks owns a channel
// for point-to-point messages. Only std::atomic members synchronize; everything else is
// written before a release store and read after the matching acquire load.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

#include "lockstep/comm/collective.h"

namespace lockstep::comm {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory flags need lock-free 64-bit atomics");

// Where a rank's buffer is, in terms every rank can resolve in its own address space:
// for threads a plain address; for processes an allocation id and a byte offset.
struct BufferRef {
  uint64_t region = 0;
  uint64_t offset = 0;
  int64_t slice_stride = 0;  // elements between consecutive slices (reduce_scatter's input)
};

enum class RankState : uint32_t { alive = 0, left = 1, failed = 2 };

// What a rank announces at a barrier. Slots keep two, by the barrier generation's parity:
// a rank may post for generation g+1 while a slower peer still reads what it posted for g,
// but cannot reach g+2 before every peer has arrived at g+1, i.e. finished reading g.
struct Post {
  CollectiveDesc desc;
  BufferRef buffer;
  int32_t split_color = 0;
  int32_t split_key = 0;
  uint64_t aux = 0;  // backend-specific (the local backend's new group at a split)
};

struct alignas(64) RankSlot {
  std::atomic<uint64_t> arrived{0};            // the last barrier generation this rank reached
  alignas(64) std::atomic<uint32_t> state{0};  // a RankState
  int32_t pid = 0;
  Post posts[2];
  char failure[256] = {};  // why this rank gave up, for the others' error messages
};

// One direction between two ranks: a single-slot mailbox the sender fills and the
// receiver drains, chunk by chunk.
struct alignas(64) Channel {
  std::atomic<uint64_t> posted{0};             // chunks the sender has written
  alignas(64) std::atomic<uint64_t> taken{0};  // chunks the receiver has copied out
  alignas(64) int32_t tag = 0;
  DType dtype = DType::f32;
  int64_t count = 0;  // elements in the whole message
  int64_t chunk_bytes = 0;
};

constexpr size_t kChannelBytes = size_t{1} << 18;  // per direction per pair

struct GroupHeader {
  uint64_t magic = 0;
  int32_t size = 0;
};

// Offsets of the parts of a control block for `size` ranks, all 64-byte aligned.
class GroupLayout {
 public:
  explicit GroupLayout(int size) : size_(size) {}

  size_t bytes() const { return channel_data_offset() + channel_count() * kChannelBytes; }
  // Constructs the atomics in fresh zeroed memory (done once, by whoever creates it).
  void construct(void* base) const {
    new (base) GroupHeader{kMagic, size_};
    for (int r = 0; r < size_; ++r) new (slot(base, r)) RankSlot();
    for (size_t c = 0; c < channel_count(); ++c) new (channel_at(base, c)) Channel();
  }
  bool valid(const void* base) const {
    const auto* header = static_cast<const GroupHeader*>(base);
    return header->magic == kMagic && header->size == size_;
  }

  RankSlot* slot(void* base, int rank) const {
    return reinterpret_cast<RankSlot*>(static_cast<char*>(base) + slots_offset() + rank * sizeof(RankSlot));
  }
  Channel* channel(void* base, int src, int dst) const { return channel_at(base, channel_index(src, dst)); }
  char* channel_data(void* base, int src, int dst) const {
    return static_cast<char*>(base) + channel_data_offset() + channel_index(src, dst) * kChannelBytes;
  }

 private:
  static constexpr uint64_t kMagic = 0x706574736b636f6cULL;  // "lockstep"
  size_t channel_count() const { return static_cast<size_t>(size_) * size_; }
  size_t channel_index(int src, int dst) const { return static_cast<size_t>(src) * size_ + dst; }
  static size_t slots_offset() { return 64; }
  size_t channels_offset() const { return slots_offset() + size_ * sizeof(RankSlot); }
  size_t channel_data_offset() const { return channels_offset() + channel_count() * sizeof(Channel); }
  Channel* channel_at(void* base, size_t index) const {
    return reinterpret_cast<Channel*>(static_cast<char*>(base) + channels_offset() + index * sizeof(Channel));
  }

  int size_;
};

}  // namespace lockstep::comm
