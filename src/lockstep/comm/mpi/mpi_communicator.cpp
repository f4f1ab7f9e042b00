#include "lockstep/comm/mpi/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/comm/mpi/mpi_process.h"
#include "lockstep/comm/slices.h"
#include "lockstep/comm/tree_reduce.h"

namespace lockstep::comm {

namespace {

// Default piece size: large enough that per-message overhead vanishes, small enough to bound
// the reduction's scratch memory. Never above 1 GiB, so every byte count and displacement of
// one piece (and n slices of it) fits MPI's int.
constexpr size_t kDefaultMaxMessageBytes = size_t{256} << 20;
constexpr size_t kMaxMessageBytesLimit = size_t{1} << 30;
// all_reduce slices start at multiples of this many bytes of the piece.

// What one rank says about a collective, as fixed-size bytes for MPI_Allgather: the call and
// its piece size (the ranks must cut messages the same way; rank 0's wins). Its tensors are in
// host memory: the Communicator stages any other through it.
struct WireDesc {
  uint64_t sequence;
  int64_t count;
  uint64_t max_message_bytes;
  int32_t root;
  uint8_t kind;
  uint8_t dtype;
  uint8_t op;
  uint8_t reserved;
};

// What a send announces before its bytes, so recv can check dtype and size.
struct WireHeader {
  uint64_t numel;
  uint64_t max_message_bytes;  // the sender's pieces, which the receiver must match
  uint8_t dtype;
  uint8_t reserved[7];
};

std::string p2p_what(const char* verb, const char* preposition, int peer, int tag, const Tensor& tensor) {
  std::ostringstream out;
  out << verb << " " << preposition << " rank " << peer << " (tag " << tag << ", " << tensor.numel() << " "
      << dtype_name(tensor.dtype()) << ")";
  return out.str();
}

// What a send or receive checks before it touches MPI: a tag MPI accepts.
void check_p2p(int tag, int tag_upper_bound, const std::string& what) {
  LOCKSTEP_CHECK(tag >= 0 && tag <= tag_upper_bound)
      << "mpi backend: " << what << ": tags must be in 0.." << tag_upper_bound << " (MPI_TAG_UB)";
}

// Element bounds of n slices of [0, count) (slices.h): slice r is [bounds[r], bounds[r+1]).
std::vector<int64_t> slice_bounds(int64_t count, int n, size_t element_size) {
  std::vector<int64_t> bounds(static_cast<size_t>(n) + 1);
  for (int r = 0; r < n; ++r) bounds[static_cast<size_t>(r)] = slice_of(count, r, n, element_size).begin;
  bounds[static_cast<size_t>(n)] = count;
  return bounds;
}

// A datatype of `bytes` contiguous bytes whose extent is `stride` bytes: with count 1 per rank
// it addresses block r at r * stride, where int displacements could not reach.
class StridedBlock {
 public:
  StridedBlock(size_t bytes, size_t stride) {
    MPI_Datatype run = MPI_DATATYPE_NULL;
    ok_ = MPI_Type_contiguous(static_cast<int>(bytes), MPI_BYTE, &run) == MPI_SUCCESS &&
          MPI_Type_create_resized(run, 0, static_cast<MPI_Aint>(stride), &type_) == MPI_SUCCESS &&
          MPI_Type_commit(&type_) == MPI_SUCCESS;
    if (run != MPI_DATATYPE_NULL) MPI_Type_free(&run);
  }
  ~StridedBlock() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  StridedBlock(const StridedBlock&) = delete;
  StridedBlock& operator=(const StridedBlock&) = delete;
  bool ok() const { return ok_; }
  MPI_Datatype type() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  bool ok_ = false;
};

int as_int(size_t bytes) { return static_cast<int>(bytes); }  // callers keep bytes <= kMaxMessageBytesLimit

}  // namespace

struct MpiCommunicator::Handle {
  MPI_Comm comm = MPI_COMM_NULL;
  int tag_upper_bound = 32767;  // MPI's guaranteed minimum until asked
  // Scratch for the reduction's received slices; one call at a time uses a communicator.
  std::unique_ptr<char[]> scratch;
  size_t scratch_bytes = 0;

  char* scratch_of(size_t bytes) {
    if (bytes > scratch_bytes) {
      scratch = std::make_unique_for_overwrite<char[]>(bytes);
      scratch_bytes = bytes;
    }
    return scratch.get();
  }
};

namespace {

// One MPI operation of a communicator: its watchdog deadline, the process lock where MPI
// calls must be serialized, and return codes turned into CommError naming the MPI function,
// the call and the rank.
class Operation {
 public:
  Operation(std::string what, std::chrono::milliseconds timeout, int rank)
      : deadline_(what, timeout), lock_(MpiProcess::get().lock()), what_(std::move(what)), rank_(rank) {}

  void check(int rc, const char* function) const {
    if (rc == MPI_SUCCESS) return;
    throw CommError("mpi backend: " + std::string(function) + " failed in " + what_ + " on rank " +
                    std::to_string(rank_) + ": " + mpi_error_string(rc));
  }

 private:
  MpiProcess::Deadline deadline_;
  std::unique_lock<std::mutex> lock_;
  std::string what_;
  int rank_;
};

}  // namespace

std::shared_ptr<MpiCommunicator> MpiCommunicator::create_world() {
  MpiProcess& process = MpiProcess::get();
  int finalized = 0;
  MPI_Finalized(&finalized);
  LOCKSTEP_CHECK(!finalized) << "mpi backend: MPI was already finalized in this process; MPI can be initialized only "
                                "once per process, so create communicators before MPI_Finalize";
  auto handle = std::make_unique<Handle>();
  int rank = 0;
  int size = 0;
  {
    auto lock = process.lock();
    // A private duplicate: our messages never match the program's own on MPI_COMM_WORLD, and
    // our error handler does not change its.
    const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &handle->comm);
    LOCKSTEP_CHECK(rc == MPI_SUCCESS) << "mpi backend: MPI_Comm_dup(MPI_COMM_WORLD) failed: " << mpi_error_string(rc);
    LOCKSTEP_CHECK(MPI_Comm_set_errhandler(handle->comm, MPI_ERRORS_RETURN) == MPI_SUCCESS)
        << "mpi backend: MPI_Comm_set_errhandler failed";
    LOCKSTEP_CHECK(MPI_Comm_rank(handle->comm, &rank) == MPI_SUCCESS &&
                   MPI_Comm_size(handle->comm, &size) == MPI_SUCCESS)
        << "mpi backend: MPI_Comm_rank/MPI_Comm_size failed on the duplicate of MPI_COMM_WORLD";
    void* value = nullptr;
    int found = 0;
    if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &found) == MPI_SUCCESS && found) {
      handle->tag_upper_bound = *static_cast<int*>(value);
    }
  }
  return std::shared_ptr<MpiCommunicator>(new MpiCommunicator(std::move(handle), rank, size));
}

MpiCommunicator::MpiCommunicator(std::unique_ptr<Handle> handle, int rank, int size)
    : Communicator(rank, size), handle_(std::move(handle)), max_message_bytes_(kDefaultMaxMessageBytes) {}

MpiCommunicator::~MpiCommunicator() {
  stop_worker();
  int finalized = 0;
  MPI_Finalized(&finalized);
  // After MPI_Finalize (a communicator outliving main) there is nothing left to free.
  if (finalized || handle_->comm == MPI_COMM_NULL) return;
  auto lock = MpiProcess::get().lock();
  MPI_Comm_free(&handle_->comm);
}

void MpiCommunicator::set_max_message_bytes(size_t bytes) {
  LOCKSTEP_CHECK(bytes >= 8 && bytes <= kMaxMessageBytesLimit)
      << "mpi backend: max_message_bytes must be between 8 and " << kMaxMessageBytesLimit << ", got " << bytes;
  max_message_bytes_.store(bytes, std::memory_order_relaxed);
}

// ---- the cross-rank check ----

namespace {

WireDesc to_wire(const CollectiveDesc& desc, size_t max_message_bytes) {
  WireDesc wire;
  std::memset(&wire, 0, sizeof wire);  // no stray padding bytes on the wire
  wire.sequence = desc.sequence;
  wire.count = desc.count;
  wire.max_message_bytes = max_message_bytes;
  wire.root = desc.root;
  wire.kind = static_cast<uint8_t>(desc.kind);
  wire.dtype = static_cast<uint8_t>(desc.dtype);
  wire.op = static_cast<uint8_t>(desc.op);
  return wire;
}

CollectiveDesc from_wire(const WireDesc& wire) {
  CollectiveDesc desc;
  desc.sequence = wire.sequence;
  desc.count = wire.count;
  desc.root = wire.root;
  desc.kind = static_cast<CollectiveKind>(wire.kind);
  desc.dtype = static_cast<DType>(wire.dtype);
  desc.op = static_cast<ReduceOp>(wire.op);
  return desc;
}

// Exchanges every rank's description and throws (on every rank alike) if they differ.
// Returns the piece size all ranks use.
size_t agree(MPI_Comm comm, int n, const CollectiveDesc& desc, size_t max_message_bytes, const Operation& op) {
  const WireDesc mine = to_wire(desc, max_message_bytes);
  std::vector<WireDesc> all(static_cast<size_t>(n));
  op.check(MPI_Allgather(&mine, sizeof(WireDesc), MPI_BYTE, all.data(), sizeof(WireDesc), MPI_BYTE, comm),
           "MPI_Allgather of the call descriptions");
  std::vector<CollectiveDesc> descs;
  descs.reserve(all.size());
  for (const WireDesc& wire : all) descs.push_back(from_wire(wire));
  check_same_on_all_ranks(descs.data(), n);
  return static_cast<size_t>(all[0].max_message_bytes);
}

}  // namespace

// ---- reductions: exchange slices, fold in rank order ----

namespace {

// The reduce-scatter step: every rank sends its block r to rank r (counts and displacements
// in send_type units; its own block stays put), receives block `me` of every other rank,
// and folds all n in rank order into out. own: this rank's block `me`, which out may alias.
struct Exchange {
  MPI_Comm comm;
  int n;
  int me;
  const Operation& op;
};
void exchange_and_fold(const Exchange& x, const char* send_base, MPI_Datatype send_type, std::vector<int>& send_counts,
                       const std::vector<int>& send_displs, const char* own, size_t block_bytes, char* scratch,
                       char* out, int64_t count, const CollectiveDesc& desc) {
  const auto n = static_cast<size_t>(x.n);
  const auto me = static_cast<size_t>(x.me);
  std::vector<int> recv_counts(n), recv_displs(n);
  std::vector<const void*> inputs(n);
  for (size_t r = 0; r < n; ++r) {
    recv_counts[r] = r == me ? 0 : as_int(block_bytes);
    recv_displs[r] = as_int(block_bytes * r);
    inputs[r] = r == me ? own : scratch + block_bytes * r;
  }
  send_counts[me] = 0;  // no copy to itself: the fold reads its own block in place
  x.op.check(MPI_Alltoallv(send_base, send_counts.data(), send_displs.data(), send_type, scratch, recv_counts.data(),
                           recv_displs.data(), MPI_BYTE, x.comm),
             "MPI_Alltoallv");
  tree_reduce(inputs.data(), x.n, out, count, desc.dtype, desc.op);
}

}  // namespace

void MpiCommunicator::do_all_reduce(const Tensor& tensor, const CollectiveDesc& desc) {
  Operation op(describe(desc), timeout(), rank());
  const int n = size();
  const size_t piece_bytes = agree(handle_->comm, n, desc, max_message_bytes(), op);
  const int64_t count = desc.count;
  if (count == 0) return;
  const Exchange exchange{handle_->comm, n, rank(), op};
  const size_t es = dtype_size(desc.dtype);
  char* data = static_cast<char*>(tensor.raw_data());
  const int64_t piece = std::max<int64_t>(1, static_cast<int64_t>(piece_bytes / es));
  std::vector<int> counts(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
  for (int64_t begin = 0; begin < count; begin += piece) {
    const int64_t len = std::min(piece, count - begin);
    char* base = data + begin * static_cast<int64_t>(es);
    const std::vector<int64_t> bounds = slice_bounds(len, n, es);
    for (size_t r = 0; r < static_cast<size_t>(n); ++r) {
      counts[r] = as_int(static_cast<size_t>(bounds[r + 1] - bounds[r]) * es);
      displs[r] = as_int(static_cast<size_t>(bounds[r]) * es);
    }
    const auto me = static_cast<size_t>(rank());
    const size_t my_bytes = static_cast<size_t>(counts[me]);
    char* mine = base + displs[me];
    // Slice r of every rank to rank r, folded there in rank order...
    std::vector<int> send_counts = counts;
    exchange_and_fold(exchange, base, MPI_BYTE, send_counts, displs, mine, my_bytes,
                      handle_->scratch_of(my_bytes * static_cast<size_t>(n)), mine, bounds[me + 1] - bounds[me], desc);
    // ...and every rank's folded slice to every rank.
    op.check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, base, counts.data(), displs.data(), MPI_BYTE, handle_->comm),
             "MPI_Allgatherv");
  }
}

void MpiCommunicator::do_reduce_scatter(const Tensor& input, const Tensor& output, const CollectiveDesc& desc) {
  Operation op(describe(desc), timeout(), rank());
  const int n = size();
  const size_t piece_bytes = agree(handle_->comm, n, desc, max_message_bytes(), op);
  const int64_t count = desc.count;  // elements per slice
  if (count == 0) return;
  const Exchange exchange{handle_->comm, n, rank(), op};
  const size_t es = dtype_size(desc.dtype);
  const size_t slice_bytes = static_cast<size_t>(count) * es;
  const char* in = static_cast<const char*>(input.raw_data());
  const char* mine = in + slice_bytes * static_cast<size_t>(rank());
  char* out = static_cast<char*>(output.raw_data());
  std::vector<int> counts(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
  if (slice_bytes * static_cast<size_t>(n) <= piece_bytes) {
    for (size_t r = 0; r < static_cast<size_t>(n); ++r) {
      counts[r] = as_int(slice_bytes);
      displs[r] = as_int(slice_bytes * r);
    }
    exchange_and_fold(exchange, in, MPI_BYTE, counts, displs, mine, slice_bytes,
                      handle_->scratch_of(slice_bytes * static_cast<size_t>(n)), out, count, desc);
    return;
  }
  // In pieces: elements [begin, begin + len) of every slice at a time, slice r being one
  // block of a datatype whose extent is a whole slice.
  const int64_t piece = std::max<int64_t>(1, static_cast<int64_t>(piece_bytes / (es * static_cast<size_t>(n))));
  for (size_t r = 0; r < static_cast<size_t>(n); ++r) displs[r] = static_cast<int>(r);
  for (int64_t begin = 0; begin < count; begin += piece) {
    const int64_t len = std::min(piece, count - begin);
    const size_t len_bytes = static_cast<size_t>(len) * es;
    const size_t offset = static_cast<size_t>(begin) * es;
    const StridedBlock block(len_bytes, slice_bytes);
    op.check(block.ok() ? MPI_SUCCESS : MPI_ERR_TYPE, "MPI_Type_create_resized");
    std::fill(counts.begin(), counts.end(), 1);
    exchange_and_fold(exchange, in + offset, block.type(), counts, displs, mine + offset, len_bytes,
                      handle_->scratch_of(len_bytes * static_cast<size_t>(n)), out + offset, len, desc);
  }
}

// ---- data movement ----

void MpiCommunicator::do_all_gather(const Tensor& input, const Tensor& output, const CollectiveDesc& desc) {
  Operation op(describe(desc), timeout(), rank());
  const int n = size();
  const size_t piece_bytes = agree(handle_->comm, n, desc, max_message_bytes(), op);
  if (desc.count == 0) return;
  const size_t es = dtype_size(desc.dtype);
  const size_t slice_bytes = static_cast<size_t>(desc.count) * es;
  const char* in = static_cast<const char*>(input.raw_data());
  char* out = static_cast<char*>(output.raw_data());
  char* own_slice = out + slice_bytes * static_cast<size_t>(rank());
  // MPI forbids overlapping send and receive buffers: the input already in its place is
  // MPI_IN_PLACE, any other overlap goes through a copy.
  const bool in_place = in == own_slice;
  const bool overlaps = !in_place && in < out + slice_bytes * static_cast<size_t>(n) && out < in + slice_bytes;
  std::vector<char> copy;
  if (overlaps) {
    copy.assign(in, in + slice_bytes);
    in = copy.data();
  }
  if (slice_bytes * static_cast<size_t>(n) <= piece_bytes) {
    op.check(MPI_Allgather(in_place ? MPI_IN_PLACE : in, as_int(slice_bytes), MPI_BYTE, out, as_int(slice_bytes),
                           MPI_BYTE, handle_->comm),
             "MPI_Allgather");
    return;
  }
  const size_t piece = std::max<size_t>(es, piece_bytes / (es * static_cast<size_t>(n)) * es);
  for (size_t offset = 0; offset < slice_bytes; offset += piece) {
    const size_t len_bytes = std::min(piece, slice_bytes - offset);
    const StridedBlock block(len_bytes, slice_bytes);
    op.check(block.ok() ? MPI_SUCCESS : MPI_ERR_TYPE, "MPI_Type_create_resized");
    // MPI_IN_PLACE means the whole own slice, so in pieces this rank sends a copy of its
    // piece instead (MPI forbids send and receive buffers that overlap).
    const char* send = in_place ? own_slice + offset : in + offset;
    if (in_place) {
      copy.assign(send, send + len_bytes);
      send = copy.data();
    }
    op.check(MPI_Allgather(send, as_int(len_bytes), MPI_BYTE, out + offset, 1, block.type(), handle_->comm),
             "MPI_Allgather");
  }
}

void MpiCommunicator::do_broadcast(const Tensor& tensor, const CollectiveDesc& desc) {
  Operation op(describe(desc), timeout(), rank());
  const size_t piece_bytes = agree(handle_->comm, size(), desc, max_message_bytes(), op);
  char* data = static_cast<char*>(tensor.raw_data());
  const size_t bytes = tensor.nbytes();
  for (size_t offset = 0; offset < bytes; offset += piece_bytes) {
    op.check(
        MPI_Bcast(data + offset, as_int(std::min(piece_bytes, bytes - offset)), MPI_BYTE, desc.root, handle_->comm),
        "MPI_Bcast");
  }
}

void MpiCommunicator::do_barrier(const CollectiveDesc& desc) {
  Operation op(describe(desc), timeout(), rank());
  agree(handle_->comm, size(), desc, max_message_bytes(), op);
  op.check(MPI_Barrier(handle_->comm), "MPI_Barrier");
}

std::shared_ptr<Communicator> MpiCommunicator::do_split(int color, int key, const CollectiveDesc& desc) {
  Operation op(describe(desc), timeout(), rank());
  agree(handle_->comm, size(), desc, max_message_bytes(), op);
  auto handle = std::make_unique<Handle>();
  handle->tag_upper_bound = handle_->tag_upper_bound;
  // MPI orders the new ranks by (key, old rank), as split() promises.
  op.check(MPI_Comm_split(handle_->comm, color < 0 ? MPI_UNDEFINED : color, key, &handle->comm), "MPI_Comm_split");
  if (handle->comm == MPI_COMM_NULL) return nullptr;
  op.check(MPI_Comm_set_errhandler(handle->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  int new_rank = 0;
  int new_size = 0;
  op.check(MPI_Comm_rank(handle->comm, &new_rank), "MPI_Comm_rank");
  op.check(MPI_Comm_size(handle->comm, &new_size), "MPI_Comm_size");
  auto result = std::shared_ptr<MpiCommunicator>(new MpiCommunicator(std::move(handle), new_rank, new_size));
  result->set_max_message_bytes(max_message_bytes());
  return result;
}

// ---- point to point ----

void MpiCommunicator::do_send(const Tensor& tensor, int peer, int tag) {
  const std::string what = p2p_what("send", "to", peer, tag, tensor);
  check_p2p(tag, handle_->tag_upper_bound, what);
  Operation op(what, timeout(), rank());
  WireHeader header;
  std::memset(&header, 0, sizeof header);
  header.numel = static_cast<uint64_t>(tensor.numel());
  header.max_message_bytes = max_message_bytes();
  header.dtype = static_cast<uint8_t>(tensor.dtype());
  op.check(MPI_Send(&header, sizeof header, MPI_BYTE, peer, tag, handle_->comm), "MPI_Send of the header");
  const char* data = static_cast<const char*>(tensor.raw_data());
  const size_t bytes = tensor.nbytes();
  for (size_t offset = 0; offset < bytes; offset += header.max_message_bytes) {
    const size_t len = std::min<size_t>(header.max_message_bytes, bytes - offset);
    op.check(MPI_Send(data + offset, as_int(len), MPI_BYTE, peer, tag, handle_->comm), "MPI_Send");
  }
}

void MpiCommunicator::do_recv(const Tensor& tensor, int peer, int tag) {
  const std::string what = p2p_what("recv", "from", peer, tag, tensor);
  check_p2p(tag, handle_->tag_upper_bound, what);
  Operation op(what, timeout(), rank());
  WireHeader header;
  std::memset(&header, 0, sizeof header);
  MPI_Status status;
  op.check(MPI_Recv(&header, sizeof header, MPI_BYTE, peer, tag, handle_->comm, &status), "MPI_Recv of the header");
  int got = 0;
  op.check(MPI_Get_count(&status, MPI_BYTE, &got), "MPI_Get_count");
  LOCKSTEP_CHECK(got == static_cast<int>(sizeof header) && header.dtype <= static_cast<uint8_t>(DType::u8) &&
                 header.max_message_bytes >= 8 && header.max_message_bytes <= kMaxMessageBytesLimit)
      << "mpi backend: " << what << ": the first message was not a lockstep send header (" << got
      << " bytes); is another library sending on this communicator?";
  const auto sent_dtype = static_cast<DType>(header.dtype);
  const size_t sent_bytes = header.numel * dtype_size(sent_dtype);
  const bool matches = sent_dtype == tensor.dtype() && header.numel == static_cast<uint64_t>(tensor.numel());
  // On a mismatch the sender's bytes are still taken (and dropped), so the sender does not hang
  // in its sends; then this rank fails.
  char* data = matches ? static_cast<char*>(tensor.raw_data()) : nullptr;
  for (size_t offset = 0; offset < sent_bytes; offset += header.max_message_bytes) {
    const size_t len = std::min<size_t>(header.max_message_bytes, sent_bytes - offset);
    char* into = data ? data + offset : handle_->scratch_of(len);
    op.check(MPI_Recv(into, as_int(len), MPI_BYTE, peer, tag, handle_->comm, &status), "MPI_Recv");
    op.check(MPI_Get_count(&status, MPI_BYTE, &got), "MPI_Get_count");
    LOCKSTEP_CHECK(static_cast<size_t>(got) == len)
        << "mpi backend: " << what << ": received " << got << " bytes where the sender announced " << len;
  }
  LOCKSTEP_CHECK(matches) << "mpi backend: " << what << ": rank " << peer << " sent " << header.numel << " "
                          << dtype_name(sent_dtype) << " (" << sent_bytes << " bytes) but the receiving tensor holds "
                          << tensor.numel() << " " << dtype_name(tensor.dtype()) << " (" << tensor.nbytes()
                          << " bytes); send and recv must use the same dtype and element count";
}

}  // namespace lockstep::comm
