#include "lockstep/comm/cuda/nccl_communicator.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

#include "lockstep/comm/cuda/nccl_state.h"
#include "lockstep/comm/cuda/tree_reduce_kernel.h"
#include "lockstep/comm/slices.h"
#include "lockstep/core/cuda_device.h"

namespace lockstep::comm {
namespace {

// Deterministic reductions run in pieces of at most this many bytes, which bounds their
// scratch memory; each piece is still large enough to keep NCCL at full bandwidth.
constexpr int64_t kPieceBytes = int64_t{64} << 20;

// What one rank says about a collective, as fixed-size bytes for ncclAllGather: the call,
// its mode, and any tensor that is not on its GPU (so every rank can fail alike).
struct WireDesc {
  uint64_t sequence;
  int64_t count;
  int32_t root;
  int32_t device;       // this rank's GPU
  int32_t stray_index;  // a tensor that is not on that GPU: its device index and type,
  uint8_t stray_type;   // or kNoStray
  uint8_t kind;
  uint8_t dtype;
  uint8_t op;
  uint8_t deterministic;
  uint8_t reserved[7];
};
static_assert(sizeof(WireDesc) == nccl::kDescBytes);
constexpr uint8_t kNoStray = 0xff;

bool overlaps(const char* a, size_t a_bytes, const char* b, size_t b_bytes) {
  return a < b + b_bytes && b < a + a_bytes;
}

// One NCCL group on comm: block k of this rank (send_counts[k] elements at
// send_base + send_offsets[k]) to rank k, and rank k's block for this rank (recv_count
// elements) into row k of rows, for every k but this rank, whose own block is copied into
// its row. Afterwards row k holds rank k's contribution, ready for the fold.
struct Exchange {
  nccl::Comm& comm;
  cudaStream_t stream;
  int n;
  int me;
  DType dtype;
  std::chrono::milliseconds timeout;
  const std::string& what;
};
void exchange_blocks(const Exchange& x, const char* send_base, const std::vector<int64_t>& send_offsets,
                     const std::vector<int64_t>& send_counts, char* rows, int64_t row_stride, int64_t recv_count) {
  const auto es = static_cast<int64_t>(dtype_size(x.dtype));
  const ncclDataType_t type = nccl::nccl_dtype(x.dtype);
  ncclResult_t rc = ncclGroupStart();
  const bool started = rc == ncclSuccess;
  for (int k = 0; k < x.n && rc == ncclSuccess; ++k) {
    if (k == x.me) continue;
    const auto kk = static_cast<size_t>(k);
    if (send_counts[kk] > 0) {
      rc = ncclSend(send_base + send_offsets[kk] * es, static_cast<size_t>(send_counts[kk]), type, k, x.comm.get(),
                    x.stream);
    }
    if (rc == ncclSuccess && recv_count > 0) {
      rc = ncclRecv(rows + k * row_stride * es, static_cast<size_t>(recv_count), type, k, x.comm.get(), x.stream);
    }
  }
  if (started) {
    const ncclResult_t end = ncclGroupEnd();
    if (rc == ncclSuccess) rc = end;
  }
  x.comm.check(rc, "ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd (the slice exchange)", x.what, x.timeout);
  const auto me = static_cast<size_t>(x.me);
  nccl::copy_async(rows + x.me * row_stride * es, send_base + send_offsets[me] * es,
                   static_cast<size_t>(recv_count * es), cudaMemcpyDeviceToDevice, x.stream);
}

}  // namespace

// ---- lifetime ----

std::shared_ptr<NcclCommunicator> NcclCommunicator::create(std::shared_ptr<Store> store, const std::string& prefix,
                                                           int rank, int size, int cuda_device,
                                                           std::chrono::milliseconds timeout, bool deterministic) {
  LOCKSTEP_CHECK(store != nullptr) << "nccl backend: create needs a store the ranks share";
  LOCKSTEP_CHECK(size >= 1 && rank >= 0 && rank < size)
      << "nccl backend: rank " << rank << " is outside a group of " << size;
  // A rank's GPU is a CUDA runtime index and its tensors' device cuda:<that index>: logical
  // devices (several per GPU, numbered apart from the GPUs) would mix the two numberings.
  LOCKSTEP_CHECK(lockstep::cuda::devices_per_gpu() == 1)
      << "nccl backend: LOCKSTEP_CUDA_DEVICES_PER_GPU=" << lockstep::cuda::devices_per_gpu()
      << " splits each GPU into logical devices, but NCCL allows one rank per GPU: unset it, or let ranks on "
         "logical devices meet over host memory (--backend shm, or one process driving them all)";
  nccl::check_runtime_version();
  int devices = 0;
  const cudaError_t found = cudaGetDeviceCount(&devices);
  if (found != cudaSuccess) {
    cudaGetLastError();
    LOCKSTEP_FAIL() << "nccl backend: rank " << rank << " finds no usable CUDA device (" << cudaGetErrorString(found)
                    << "); check the driver with nvidia-smi, or use the shm or mpi backend for CPU tensors";
  }
  LOCKSTEP_CHECK(cuda_device >= 0 && cuda_device < devices)
      << "nccl backend: rank " << rank << " asked for cuda:" << cuda_device << " but this process sees " << devices
      << " CUDA device(s) (cuda:0..cuda:" << devices - 1 << "; CUDA_VISIBLE_DEVICES may hide others)";
  nccl::CurrentDevice current(cuda_device);
  // Before the rendezvous: once it completes, every rank of this process is registered.
  nccl::register_rank_gpu(cuda_device);
  const std::string key = prefix + "/nccl_unique_id";
  ncclUniqueId id;
  if (rank == 0) {
    LOCKSTEP_NCCL_CALL(ncclGetUniqueId(&id));
    store->set(key, nccl::to_hex(id));
  } else {
    id = nccl::from_hex(store->get(key, timeout), key);
  }
  auto state = std::make_unique<State>(std::move(store), prefix, cuda_device, deterministic, size);
  state->world = nccl::Comm::init(id, size, rank, timeout,
                                  "rendezvous of the nccl backend (" + prefix + ", rank " + std::to_string(rank) +
                                      " of " + std::to_string(size) + " on cuda:" + std::to_string(cuda_device) + ")");
  auto comm = wrap(std::move(state));
  comm->set_timeout(timeout);
  return comm;
}

std::shared_ptr<NcclCommunicator> NcclCommunicator::wrap(std::unique_ptr<State> state) {
  const int rank = state->world->user_rank();
  const int size = state->world->count();
  return std::shared_ptr<NcclCommunicator>(new NcclCommunicator(rank, size, std::move(state)));
}

NcclCommunicator::NcclCommunicator(int rank, int size, std::unique_ptr<State> state)
    : Communicator(rank, size), state_(std::move(state)) {}

NcclCommunicator::~NcclCommunicator() {
  stop_worker();  // the lanes' queued calls still use the state
  try {
    nccl::CurrentDevice current(state_->device);
    state_.reset();
  } catch (const std::exception&) {
    state_.reset();  // no device to switch to; free what can be freed
  }
}

int NcclCommunicator::cuda_device() const { return state_->device; }
bool NcclCommunicator::deterministic() const { return state_->deterministic; }
Device NcclCommunicator::memory() const { return nccl::cuda_device(state_->device); }

// ---- the cross-rank check ----

void NcclCommunicator::agree(const CollectiveDesc& desc, const Tensor* a, const Tensor* b, const std::string& what) {
  State& s = *state_;
  const int n = size();
  constexpr size_t kBytes = nccl::kDescBytes;
  WireDesc mine;
  std::memset(&mine, 0, sizeof mine);  // no stray padding bytes on the wire
  mine.sequence = desc.sequence;
  mine.count = desc.count;
  mine.root = desc.root;
  mine.device = s.device;
  mine.stray_type = kNoStray;
  mine.kind = static_cast<uint8_t>(desc.kind);
  mine.dtype = static_cast<uint8_t>(desc.dtype);
  mine.op = static_cast<uint8_t>(desc.op);
  mine.deterministic = s.deterministic ? 1 : 0;
  for (const Tensor* t : {a, b}) {
    if (t && t->device() != nccl::cuda_device(s.device)) {
      mine.stray_type = static_cast<uint8_t>(t->device().type());
      mine.stray_index = t->device().index();
      break;
    }
  }
  char* host = s.descs.get();
  char* device = s.control.reserve(static_cast<size_t>(n) * kBytes + sizeof(int64_t));
  const size_t own = static_cast<size_t>(rank()) * kBytes;
  std::memcpy(host + own, &mine, kBytes);
  cudaStream_t stream = s.collectives.get();
  nccl::copy_async(device + own, host + own, kBytes, cudaMemcpyHostToDevice, stream);
  s.world->check(ncclAllGather(device + own, device, kBytes, ncclUint8, s.world->get(), stream),
                 "ncclAllGather of the call descriptions", what, timeout());
  nccl::copy_async(host, device, static_cast<size_t>(n) * kBytes, cudaMemcpyDeviceToHost, stream);
  s.world->wait(stream, what, timeout());

  std::vector<WireDesc> wires(static_cast<size_t>(n));
  std::memcpy(wires.data(), host, static_cast<size_t>(n) * kBytes);
  std::vector<CollectiveDesc> descs(static_cast<size_t>(n));
  for (size_t r = 0; r < wires.size(); ++r) {
    descs[r].sequence = wires[r].sequence;
    descs[r].count = wires[r].count;
    descs[r].root = wires[r].root;
    descs[r].kind = static_cast<CollectiveKind>(wires[r].kind);
    descs[r].dtype = static_cast<DType>(wires[r].dtype);
    descs[r].op = static_cast<ReduceOp>(wires[r].op);
  }
  check_same_on_all_ranks(descs.data(), n);
  for (size_t r = 0; r < wires.size(); ++r) {
    const WireDesc& w = wires[r];
    LOCKSTEP_CHECK(w.deterministic == wires[0].deterministic)
        << "nccl backend: " << describe(desc) << ": rank 0 is " << (wires[0].deterministic ? "" : "not ")
        << "in deterministic mode but rank " << r << " is " << (w.deterministic ? "" : "not ")
        << "; every rank must create its communicator with the same `deterministic` flag";
    LOCKSTEP_CHECK(w.stray_type == kNoStray)
        << "nccl backend: " << describe(desc) << ": rank " << r << " passed a tensor on "
        << Device(static_cast<DeviceType>(w.stray_type), w.stray_index) << " but its communicator is on "
        << nccl::cuda_device(w.device)
        << "; the nccl backend moves tensors on its own GPU (host tensors travel through it, another GPU's do "
           "not): copy the tensor there first";
  }
}

// ---- reductions ----

void NcclCommunicator::do_all_reduce(const Tensor& tensor, const CollectiveDesc& desc) {
  State& s = *state_;
  nccl::CurrentDevice current(s.device);
  const lockstep::cuda::CommunicationScope in_flight(s.device);  // no cudaFree while it runs
  const std::string what = describe(desc) + " on rank " + std::to_string(rank());
  agree(desc, &tensor, nullptr, what);
  if (desc.count == 0) return;
  s.collectives.follow_producers(s.device);
  if (s.deterministic) {
    deterministic_all_reduce(tensor, desc, what);
  } else {
    char* data = nccl::device_pointer(tensor);
    // avg: NCCL sums, then the quotient is taken once (ncclAvg's rounded 1/n biases bf16).
    const ReduceOp op = desc.op == ReduceOp::avg ? ReduceOp::sum : desc.op;
    s.world->check(ncclAllReduce(data, data, static_cast<size_t>(desc.count), nccl::nccl_dtype(desc.dtype),
                                 nccl::nccl_op(op), s.world->get(), s.collectives.get()),
                   "ncclAllReduce", what, timeout());
    if (desc.op == ReduceOp::avg) cuda::divide_elements(data, desc.count, desc.dtype, size(), s.collectives.get());
  }
  s.world->wait(s.collectives.get(), what, timeout());
}

// Slice r of every rank goes to rank r, which folds the n copies in rank order; then every
// rank's folded slice goes to every rank. The same bytes cross the links as in NCCL's ring
// (2 (n-1)/n of the tensor per rank), as an exchange plus an all-gather, with one fold
// kernel between them and scratch of about the tensor's size (at most one piece).
void NcclCommunicator::deterministic_all_reduce(const Tensor& tensor, const CollectiveDesc& desc,
                                                const std::string& what) {
  State& s = *state_;
  const int n = size();
  const int me = rank();
  const auto es = static_cast<int64_t>(dtype_size(desc.dtype));
  cudaStream_t stream = s.collectives.get();
  const Exchange exchange{*s.world, stream, n, me, desc.dtype, timeout(), what};
  char* data = nccl::device_pointer(tensor);
  // Pieces are whole multiples of n aligned slices (but the last), so they split evenly.
  const int64_t align = std::max<int64_t>(1, kSliceAlignBytes / es);
  const int64_t piece = std::max<int64_t>(1, kPieceBytes / es / (n * align)) * n * align;
  std::vector<int64_t> offsets(static_cast<size_t>(n)), counts(static_cast<size_t>(n));
  for (int64_t begin = 0; begin < desc.count; begin += piece) {
    const int64_t len = std::min(piece, desc.count - begin);
    // The one cut of comm/slices.h: rank 0's slice is the longest, the last ones shorter or
    // empty, so every row of the exchange is rank 0's length.
    const int64_t slice = slice_of(len, 0, n, static_cast<size_t>(es)).size;
    for (int r = 0; r < n; ++r) {
      const Slice mine = slice_of(len, r, n, static_cast<size_t>(es));
      offsets[static_cast<size_t>(r)] = mine.begin;
      counts[static_cast<size_t>(r)] = mine.size;
    }
    char* base = data + begin * es;
    char* rows = s.scratch.reserve(static_cast<size_t>(n * slice * es));
    const int64_t mine = counts[static_cast<size_t>(me)];
    exchange_blocks(exchange, base, offsets, counts, rows, slice, mine);
    // Even slices fold straight into the tensor and gather in place there; ragged ones
    // fold into this rank's row (in place, which the kernel allows), gather the padded
    // rows, and copy the real elements back.
    const bool even = len == n * slice;
    char* gathered = even ? base : rows;
    char* folded = gathered + me * slice * es;
    cuda::tree_reduce_rows(rows, slice, n, folded, mine, desc.dtype, desc.op, stream);
    s.world->check(ncclAllGather(folded, gathered, static_cast<size_t>(slice), nccl::nccl_dtype(desc.dtype),
                                 s.world->get(), stream),
                   "ncclAllGather of the folded slices", what, timeout());
    if (!even) nccl::copy_async(base, rows, static_cast<size_t>(len * es), cudaMemcpyDeviceToDevice, stream);
  }
}

void NcclCommunicator::do_reduce_scatter(const Tensor& input, const Tensor& output, const CollectiveDesc& desc) {
  State& s = *state_;
  nccl::CurrentDevice current(s.device);
  const lockstep::cuda::CommunicationScope in_flight(s.device);  // no cudaFree while it runs
  const std::string what = describe(desc) + " on rank " + std::to_string(rank());
  agree(desc, &input, &output, what);
  if (desc.count == 0) return;
  s.collectives.follow_producers(s.device);
  if (s.deterministic) {
    deterministic_reduce_scatter(input, output, desc, what);
  } else {
    const size_t slice_bytes = output.nbytes();
    const char* in = nccl::device_pointer(input);
    char* out = nccl::device_pointer(output);
    // NCCL allows one overlap, output at this rank's slice of input; others go through a copy.
    if (out != in + slice_bytes * static_cast<size_t>(rank()) && overlaps(in, input.nbytes(), out, slice_bytes)) {
      char* copy = s.staging.reserve(input.nbytes());
      nccl::copy_async(copy, in, input.nbytes(), cudaMemcpyDeviceToDevice, s.collectives.get());
      in = copy;
    }
    const ReduceOp op = desc.op == ReduceOp::avg ? ReduceOp::sum : desc.op;  // as in all_reduce
    s.world->check(ncclReduceScatter(in, out, static_cast<size_t>(desc.count), nccl::nccl_dtype(desc.dtype),
                                     nccl::nccl_op(op), s.world->get(), s.collectives.get()),
                   "ncclReduceScatter", what, timeout());
    if (desc.op == ReduceOp::avg) cuda::divide_elements(out, desc.count, desc.dtype, size(), s.collectives.get());
  }
  s.world->wait(s.collectives.get(), what, timeout());
}

void NcclCommunicator::deterministic_reduce_scatter(const Tensor& input, const Tensor& output,
                                                    const CollectiveDesc& desc, const std::string& what) {
  State& s = *state_;
  const int n = size();
  const auto es = static_cast<int64_t>(dtype_size(desc.dtype));
  cudaStream_t stream = s.collectives.get();
  const Exchange exchange{*s.world, stream, n, rank(), desc.dtype, timeout(), what};
  const int64_t count = desc.count;
  const char* in = nccl::device_pointer(input);
  char* out = nccl::device_pointer(output);
  // Piece p of every slice is sent before piece p of the output is written, so an output
  // that is one of input's slices is safe; any other overlap goes through a copy.
  const auto distance = static_cast<int64_t>(out - in);
  if (overlaps(in, input.nbytes(), out, output.nbytes()) && distance % (count * es) != 0) {
    char* copy = s.staging.reserve(input.nbytes());
    nccl::copy_async(copy, in, input.nbytes(), cudaMemcpyDeviceToDevice, stream);
    in = copy;
  }
  const int64_t piece = std::max<int64_t>(1, kPieceBytes / es / n);
  std::vector<int64_t> offsets(static_cast<size_t>(n)), counts(static_cast<size_t>(n));
  for (int64_t begin = 0; begin < count; begin += piece) {
    const int64_t len = std::min(piece, count - begin);
    for (int r = 0; r < n; ++r) {
      offsets[static_cast<size_t>(r)] = r * count + begin;
      counts[static_cast<size_t>(r)] = len;
    }
    char* rows = s.scratch.reserve(static_cast<size_t>(n * len * es));
    exchange_blocks(exchange, in, offsets, counts, rows, len, len);
    cuda::tree_reduce_rows(rows, len, n, out + begin * es, len, desc.dtype, desc.op, stream);
  }
}

// ---- data movement ----

void NcclCommunicator::do_all_gather(const Tensor& input, const Tensor& output, const CollectiveDesc& desc) {
  State& s = *state_;
  nccl::CurrentDevice current(s.device);
  const lockstep::cuda::CommunicationScope in_flight(s.device);  // no cudaFree while it runs
  const std::string what = describe(desc) + " on rank " + std::to_string(rank());
  agree(desc, &input, &output, what);
  if (desc.count == 0) return;
  s.collectives.follow_producers(s.device);
  const size_t slice_bytes = input.nbytes();
  const char* in = nccl::device_pointer(input);
  char* out = nccl::device_pointer(output);
  // NCCL allows one overlap, input at this rank's slice of output; others go through a copy.
  if (in != out + slice_bytes * static_cast<size_t>(rank()) && overlaps(in, slice_bytes, out, output.nbytes())) {
    char* copy = s.staging.reserve(slice_bytes);
    nccl::copy_async(copy, in, slice_bytes, cudaMemcpyDeviceToDevice, s.collectives.get());
    in = copy;
  }
  s.world->check(ncclAllGather(in, out, static_cast<size_t>(desc.count), nccl::nccl_dtype(desc.dtype), s.world->get(),
                               s.collectives.get()),
                 "ncclAllGather", what, timeout());
  s.world->wait(s.collectives.get(), what, timeout());
}

void NcclCommunicator::do_broadcast(const Tensor& tensor, const CollectiveDesc& desc) {
  State& s = *state_;
  nccl::CurrentDevice current(s.device);
  const lockstep::cuda::CommunicationScope in_flight(s.device);  // no cudaFree while it runs
  const std::string what = describe(desc) + " on rank " + std::to_string(rank());
  agree(desc, &tensor, nullptr, what);
  if (desc.count == 0) return;
  s.collectives.follow_producers(s.device);
  char* data = nccl::device_pointer(tensor);
  s.world->check(ncclBroadcast(data, data, static_cast<size_t>(desc.count), nccl::nccl_dtype(desc.dtype), desc.root,
                               s.world->get(), s.collectives.get()),
                 "ncclBroadcast", what, timeout());
  s.world->wait(s.collectives.get(), what, timeout());
}

void NcclCommunicator::do_barrier(const CollectiveDesc& desc) {
  State& s = *state_;
  nccl::CurrentDevice current(s.device);
  const lockstep::cuda::CommunicationScope in_flight(s.device);  // no cudaFree while it runs
  const std::string what = describe(desc) + " on rank " + std::to_string(rank());
  agree(desc, nullptr, nullptr, what);
  // An all-reduce of one word: it completes on a rank only once every rank has joined.
  cudaStream_t stream = s.collectives.get();
  char* word = s.control.reserve(static_cast<size_t>(size()) * nccl::kDescBytes + sizeof(int64_t)) +
               static_cast<size_t>(size()) * nccl::kDescBytes;
  LOCKSTEP_CUDA_CALL(cudaMemsetAsync(word, 0, sizeof(int32_t), stream));
  s.world->check(ncclAllReduce(word, word, 1, ncclInt32, ncclSum, s.world->get(), stream), "ncclAllReduce", what,
                 timeout());
  s.world->wait(stream, what, timeout());
}

// ---- split ----

std::shared_ptr<Communicator> NcclCommunicator::do_split(int color, int key, const CollectiveDesc& desc) {
  State& s = *state_;
  nccl::CurrentDevice current(s.device);
  const lockstep::cuda::CommunicationScope in_flight(s.device);  // no cudaFree while it runs
  const std::string what = describe(desc) + " on rank " + std::to_string(rank());
  agree(desc, nullptr, nullptr, what);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  // NCCL ranks the new group by (key, old rank), as split() promises.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t raw = nullptr;
  const ncclResult_t rc = ncclCommSplit(s.world->get(), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &raw, &config);
  // On a non-blocking parent the split completes in the background: the parent's state
  // says when, and only then is the new communicator's handle written.
  s.world->check(rc == ncclSuccess ? ncclInProgress : rc, "ncclCommSplit", what, timeout());
  if (color < 0) return nullptr;
  LOCKSTEP_CHECK(raw != nullptr) << "nccl backend: " << what << ": ncclCommSplit returned no communicator for color "
                                 << color;
  std::unique_ptr<nccl::Comm> world = nccl::Comm::adopt(raw, timeout(), what);
  auto state = std::make_unique<State>(
      s.store, s.prefix + "/split" + std::to_string(desc.sequence) + "/color" + std::to_string(color), s.device,
      s.deterministic, world->count());
  state->world = std::move(world);
  return wrap(std::move(state));
#else
  return split_through_store(color, key, desc);
#endif
}

std::shared_ptr<Communicator> NcclCommunicator::split_through_store(int color, int key, const CollectiveDesc& desc) {
  State& s = *state_;
  const std::string what = describe(desc) + " on rank " + std::to_string(rank());
  const std::string base = s.prefix + "/split" + std::to_string(desc.sequence);
  const std::vector<std::string> entries = store_all_gather(
      *s.store, base + "/members", rank(), size(), std::to_string(color) + " " + std::to_string(key), timeout(), what);
  if (color < 0) return nullptr;
  std::vector<std::pair<int, int>> members;  // (key, old rank) of this color
  for (int r = 0; r < size(); ++r) {
    std::istringstream in(entries[static_cast<size_t>(r)]);
    int their_color = 0;
    int their_key = 0;
    in >> their_color >> their_key;
    if (their_color == color) members.emplace_back(their_key, r);
  }
  std::sort(members.begin(), members.end());
  const auto mine = std::find(members.begin(), members.end(), std::make_pair(key, rank()));
  const int new_rank = static_cast<int>(mine - members.begin());
  const int new_size = static_cast<int>(members.size());
  const std::string prefix = base + "/color" + std::to_string(color);
  const std::string id_key = prefix + "/nccl_unique_id";
  ncclUniqueId id;
  if (new_rank == 0) {
    LOCKSTEP_NCCL_CALL(ncclGetUniqueId(&id));
    s.store->set(id_key, nccl::to_hex(id));
  } else {
    id = nccl::from_hex(s.store->get(id_key, timeout()), id_key);
  }
  auto state = std::make_unique<State>(s.store, prefix, s.device, s.deterministic, new_size);
  state->world = nccl::Comm::init(id, new_size, new_rank, timeout(), what);
  return wrap(std::move(state));
}

}  // namespace lockstep::comm
