#include "lockstep/comm/one_host_communicator.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "lockstep/comm/env_sizes.h"
#include "lockstep/comm/slices.h"
#include "lockstep/comm/tree_reduce.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace lockstep::comm {
namespace {

using Clock = std::chrono::steady_clock;

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

double seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

}  // namespace

OneHostCommunicator::OneHostCommunicator(int rank, int size, void* control)
    : Communicator(rank, size),
      layout_(size),
      control_(control),
      direct_bytes_(direct_all_reduce_bytes(env_value("LOCKSTEP_DIRECT_ALLREDUCE_BYTES"), kDirectAllReduceBytes)) {}

OneHostCommunicator::~OneHostCommunicator() = default;

void OneHostCommunicator::leave() {
  // Peers waiting for this rank in a call it will never make fail at once instead of at
  // their timeout.
  stop_worker();
  if (static_cast<RankState>(slot(rank())->state.load(std::memory_order_acquire)) == RankState::alive) {
    mark(RankState::left);
  }
}

void OneHostCommunicator::mark(RankState state, const std::string& why) {
  // Lanes may fail at once; the first one tells the peers why.
  if (marked_.exchange(true)) return;
  RankSlot* mine = slot(rank());
  const size_t n = std::min(why.size(), sizeof(mine->failure) - 1);
  std::memcpy(mine->failure, why.data(), n);
  mine->failure[n] = '\0';
  mine->state.store(static_cast<uint32_t>(state), std::memory_order_release);
}

void OneHostCommunicator::fail(const std::string& message) {
  mark(RankState::failed, message);
  throw CommError(message);
}

// Spins briefly (the peer is usually a few microseconds away), then yields the core: ranks
// may outnumber cores. Every few milliseconds: is the peer gone, has the deadline passed?
template <typename Ready, typename Call>
void OneHostCommunicator::wait_for(Ready ready, int peer, Call call, const std::function<std::vector<int>()>& missing) {
  for (int i = 0; i < 2000; ++i) {
    if (ready()) return;
    cpu_relax();
  }
  const auto start = Clock::now();
  const auto deadline = start + timeout();
  auto next_check = start;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return;
      sched_yield();
    }
    const auto now = Clock::now();
    if (now < next_check) continue;
    next_check = now + std::chrono::milliseconds(20);
    const RankSlot* other = slot(peer);
    const auto state = static_cast<RankState>(other->state.load(std::memory_order_acquire));
    if (state == RankState::alive) {
      check_alive(peer, call());
    } else {
      if (ready()) return;  // it finished this call before it went
      std::ostringstream message;
      message << call() << ": rank " << peer << " of " << size()
              << (state == RankState::left ? " left the group (its communicator was destroyed) before joining"
                                           : " failed");
      if (other->failure[0] != '\0') message << ": " << other->failure;
      fail(message.str());
    }
    if (now > deadline) {
      const std::vector<int> peers = missing ? missing() : std::vector<int>{peer};
      std::ostringstream message;
      message << call() << ": rank " << rank() << " waited " << seconds(timeout()) << " s for ";
      if (peers.size() == 1) {
        message << "rank " << peers[0];
      } else {
        message << "ranks " << rank_list(peers);
      }
      message << " of " << size() << " and gave up; a rank that hangs, died, or skipped this call stops the group "
              << "(LOCKSTEP_COMM_TIMEOUT sets the limit)";
      fail(message.str());
    }
  }
}

void OneHostCommunicator::arrive_and_wait(const Post& post) {
  const uint64_t generation = ++generation_;
  RankSlot* mine = slot(rank());
  mine->posts[generation & 1] = post;
  mine->arrived.store(generation, std::memory_order_release);
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    const RankSlot* other = slot(peer);
    auto arrived = [&] { return other->arrived.load(std::memory_order_acquire) >= generation; };
    if (arrived()) continue;
    // A timeout names every missing rank, not only the first one waited for.
    wait_for(
        arrived, peer, [&] { return describe(current_desc_); },
        [&] {
          std::vector<int> missing;
          for (int q = 0; q < size(); ++q) {
            if (q != rank() && slot(q)->arrived.load(std::memory_order_acquire) < generation) missing.push_back(q);
          }
          return missing;
        });
  }
}

const Post& OneHostCommunicator::post_of(int peer) const { return slot(peer)->posts[generation_ & 1]; }

void OneHostCommunicator::enter(const CollectiveDesc& desc, const BufferRef& buffer, bool first_piece) {
  current_desc_ = desc;
  Post post;
  post.desc = desc;
  post.buffer = buffer;
  arrive_and_wait(post);
  if (!first_piece) return;
  descs_.resize(size());
  for (int r = 0; r < size(); ++r) descs_[r] = post_of(r).desc;
  try {
    check_same_on_all_ranks(descs_.data(), size());
  } catch (const Error& error) {
    mark(RankState::failed, error.what());
    throw;
  }
}

char* OneHostCommunicator::publish(char* data, size_t bytes, bool copy_in, BufferRef* ref) {
  if (std::optional<BufferRef> direct = direct_ref(data, bytes)) {
    *ref = *direct;
    return data;
  }
  char* area = static_cast<char*>(staging(ref));
  if (copy_in && bytes) std::memcpy(area, data, bytes);
  return area;
}

size_t OneHostCommunicator::piece_elements(DType dtype, int64_t per_element_multiple) const {
  const size_t per_element = dtype_size(dtype) * static_cast<size_t>(per_element_multiple);
  return std::max<size_t>(1, staging_bytes() / per_element);
}

// ---- collectives ----

void OneHostCommunicator::do_barrier(const CollectiveDesc& desc) { enter(desc, BufferRef(), true); }

void OneHostCommunicator::do_all_reduce(const Tensor& tensor, const CollectiveDesc& desc) {
  if (size() == 1) return;  // the fold of one buffer is itself (avg divides by 1)
  const size_t element = dtype_size(desc.dtype);
  const int64_t count = desc.count;
  const int64_t piece = static_cast<int64_t>(piece_elements(desc.dtype, 1));
  char* base = static_cast<char*>(tensor.raw_data());
  int64_t start = 0;
  do {
    const int64_t n = std::min(piece, count - start);
    const size_t bytes = static_cast<size_t>(n) * element;
    char* mine = base + static_cast<size_t>(start) * element;
    BufferRef ref;
    char* buffer = publish(mine, bytes, true, &ref);
    enter(desc, ref, start == 0);
    std::vector<void*>& buffers = peer_buffers_;
    buffers.resize(size());
    for (int q = 0; q < size(); ++q) buffers[q] = q == rank() ? buffer : resolve(q, post_of(q).buffer);
    if (bytes <= direct_bytes_) {
      // Every rank folds everything; it writes only its own buffer, after all have read.
      if (result_.size() < bytes) result_.resize(bytes);
      tree_reduce(buffers.data(), size(), result_.data(), n, desc.dtype, desc.op);
      arrive_and_wait(Post());
      if (bytes) std::memcpy(mine, result_.data(), bytes);
    } else {
      // Rank r folds slice r (slices.h) into every rank's buffer.
      const auto [begin, len] = slice_of(n, rank(), size(), element);
      for (int q = 0; q < size(); ++q) buffers[q] = static_cast<char*>(buffers[q]) + begin * element;
      tree_reduce_to_many(buffers.data(), size(), buffers.data(), size(), len, desc.dtype, desc.op);
      arrive_and_wait(Post());
      if (buffer != mine && bytes) std::memcpy(mine, buffer, bytes);
    }
    start += n;
  } while (start < count);
}

void OneHostCommunicator::do_reduce_scatter(const Tensor& input, const Tensor& output, const CollectiveDesc& desc) {
  const size_t element = dtype_size(desc.dtype);
  const int64_t count = desc.count;  // per rank
  const int64_t piece = static_cast<int64_t>(piece_elements(desc.dtype, size()));
  char* in = static_cast<char*>(input.raw_data());
  char* out = static_cast<char*>(output.raw_data());
  const size_t all_bytes = static_cast<size_t>(count) * size() * element;
  const std::optional<BufferRef> direct = direct_ref(in, all_bytes);
  int64_t start = 0;
  do {
    const int64_t n = std::min(piece, count - start);
    BufferRef ref;
    if (direct) {
      ref = *direct;
      ref.offset += static_cast<uint64_t>(start) * element;
      ref.slice_stride = count;
    } else {
      char* area = static_cast<char*>(staging(&ref));
      for (int q = 0; q < size() && n > 0; ++q) {
        std::memcpy(area + static_cast<size_t>(q * n) * element, in + static_cast<size_t>(q * count + start) * element,
                    static_cast<size_t>(n) * element);
      }
      ref.slice_stride = n;
    }
    enter(desc, ref, start == 0);
    std::vector<void*>& slices = peer_buffers_;
    slices.resize(size());
    for (int q = 0; q < size(); ++q) {
      const BufferRef& theirs = q == rank() ? ref : post_of(q).buffer;
      slices[q] = static_cast<char*>(resolve(q, theirs)) + static_cast<size_t>(rank() * theirs.slice_stride) * element;
    }
    tree_reduce(slices.data(), size(), out + static_cast<size_t>(start) * element, n, desc.dtype, desc.op);
    arrive_and_wait(Post());
    start += n;
  } while (start < count);
}

void OneHostCommunicator::do_all_gather(const Tensor& input, const Tensor& output, const CollectiveDesc& desc) {
  const size_t element = dtype_size(desc.dtype);
  const int64_t count = desc.count;  // per rank
  const int64_t piece = static_cast<int64_t>(piece_elements(desc.dtype, 1));
  char* in = static_cast<char*>(input.raw_data());
  char* out = static_cast<char*>(output.raw_data());
  int64_t start = 0;
  do {
    const int64_t n = std::min(piece, count - start);
    const size_t bytes = static_cast<size_t>(n) * element;
    BufferRef ref;
    publish(in + static_cast<size_t>(start) * element, bytes, true, &ref);
    enter(desc, ref, start == 0);
    for (int q = 0; q < size(); ++q) {
      const void* theirs = resolve(q, q == rank() ? ref : post_of(q).buffer);
      char* slot = out + static_cast<size_t>(q * count + start) * element;
      if (bytes && theirs != slot) std::memcpy(slot, theirs, bytes);  // equal: in place
    }
    arrive_and_wait(Post());
    start += n;
  } while (start < count);
}

void OneHostCommunicator::do_broadcast(const Tensor& tensor, const CollectiveDesc& desc) {
  const size_t element = dtype_size(desc.dtype);
  const int64_t count = desc.count;
  const int64_t piece = static_cast<int64_t>(piece_elements(desc.dtype, 1));
  char* base = static_cast<char*>(tensor.raw_data());
  const bool root = rank() == desc.root;
  int64_t start = 0;
  do {
    const int64_t n = std::min(piece, count - start);
    const size_t bytes = static_cast<size_t>(n) * element;
    char* mine = base + static_cast<size_t>(start) * element;
    BufferRef ref;
    if (root) publish(mine, bytes, true, &ref);
    enter(desc, ref, start == 0);
    if (!root && bytes) std::memcpy(mine, resolve(desc.root, post_of(desc.root).buffer), bytes);
    arrive_and_wait(Post());
    start += n;
  } while (start < count);
}

std::shared_ptr<Communicator> OneHostCommunicator::do_split(int color, int key, const CollectiveDesc& desc) {
  current_desc_ = desc;
  Post post;
  post.desc = desc;
  post.split_color = color;
  post.split_key = key;
  arrive_and_wait(post);
  std::vector<CollectiveDesc> descs(size());
  std::vector<std::pair<int, int>> keyed;  // (key, old rank) of my color
  for (int r = 0; r < size(); ++r) {
    descs[r] = post_of(r).desc;
    if (color >= 0 && post_of(r).split_color == color) keyed.emplace_back(post_of(r).split_key, r);
  }
  check_same_on_all_ranks(descs.data(), size());
  std::sort(keyed.begin(), keyed.end());
  std::vector<int> members;
  for (const auto& [k, r] : keyed) members.push_back(r);
  std::shared_ptr<Communicator> result = make_subgroup(members, color, desc);
  arrive_and_wait(Post());  // nobody reuses its posts until every rank has read them
  return result;
}

// ---- point to point: one mailbox per direction, filled and drained a chunk at a time ----

void OneHostCommunicator::do_send(const Tensor& tensor, int peer, int tag) {
  auto call = [&] {
    std::ostringstream what;
    what << "send to rank " << peer << " (tag " << tag << ", " << tensor.numel() << " " << dtype_name(tensor.dtype())
         << ")";
    return what.str();
  };
  Channel* channel = layout_.channel(control_, rank(), peer);
  char* area = layout_.channel_data(control_, rank(), peer);
  const char* data = static_cast<const char*>(tensor.raw_data());
  const size_t total = tensor.nbytes();
  size_t sent = 0;
  do {
    const uint64_t posted = channel->posted.load(std::memory_order_relaxed);
    wait_for([&] { return channel->taken.load(std::memory_order_acquire) == posted; }, peer, call, nullptr);
    const size_t chunk = std::min(kChannelBytes, total - sent);
    channel->tag = tag;
    channel->dtype = tensor.dtype();
    channel->count = tensor.numel();
    channel->chunk_bytes = static_cast<int64_t>(chunk);
    if (chunk) std::memcpy(area, data + sent, chunk);
    channel->posted.store(posted + 1, std::memory_order_release);
    sent += chunk;
  } while (sent < total);
}

void OneHostCommunicator::do_recv(const Tensor& tensor, int peer, int tag) {
  auto call = [&] {
    std::ostringstream what;
    what << "recv from rank " << peer << " (tag " << tag << ", " << tensor.numel() << " " << dtype_name(tensor.dtype())
         << ")";
    return what.str();
  };
  Channel* channel = layout_.channel(control_, peer, rank());
  const char* area = layout_.channel_data(control_, peer, rank());
  char* data = static_cast<char*>(tensor.raw_data());
  const size_t total = tensor.nbytes();
  size_t received = 0;
  do {
    const uint64_t taken = channel->taken.load(std::memory_order_relaxed);
    wait_for([&] { return channel->posted.load(std::memory_order_acquire) > taken; }, peer, call, nullptr);
    if (received == 0 &&
        (channel->tag != tag || channel->dtype != tensor.dtype() || channel->count != tensor.numel())) {
      std::ostringstream message;
      message << call() << ": rank " << peer << " sent tag " << channel->tag << ", " << channel->count << " "
              << dtype_name(channel->dtype) << "; messages between two ranks arrive in the order sent, and each "
              << "recv must match its send's tag, dtype and element count";
      fail(message.str());
    }
    const size_t chunk = static_cast<size_t>(channel->chunk_bytes);
    if (chunk) std::memcpy(data + received, area, chunk);
    channel->taken.store(taken + 1, std::memory_order_release);
    received += chunk;
  } while (received < total);
}

}  // namespace lockstep::comm
