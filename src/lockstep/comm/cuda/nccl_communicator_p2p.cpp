// The nccl backend's send and recv (the rest is in nccl_communicator.cpp). A message is a
// header (tag, dtype, count) and then its bytes, on a two-rank NCCL communicator of its own
// direction, so that a receiver can check what arrives and sends and receives never queue
// behind each other or behind collectives.
#include <cstring>
#include <sstream>

#include "lockstep/comm/cuda/nccl_communicator.h"
#include "lockstep/comm/cuda/nccl_state.h"

namespace lockstep::comm {
namespace {

// What a send announces before its bytes, so recv can check tag, dtype and size.
struct P2pHeader {
  uint64_t magic;
  uint64_t numel;
  int32_t tag;
  uint8_t dtype;
  uint8_t reserved[3];
};
constexpr uint64_t kP2pMagic = 0x6c63636e70657473ULL;  // "stepnccl"
static_assert(sizeof(P2pHeader) == nccl::kHeaderBytes);

std::string p2p_what(const char* verb, const char* preposition, int peer, int tag, const Tensor& tensor, int rank) {
  std::ostringstream out;
  out << verb << " " << preposition << " rank " << peer << " (tag " << tag << ", " << tensor.numel() << " "
      << dtype_name(tensor.dtype()) << ") on rank " << rank;
  return out.str();
}

}  // namespace

// One communicator per direction and peer. Each is used by one lane on each side (the
// sender's sends, the receiver's receives), so a lane never waits behind another lane's
// unrelated NCCL work, and no NCCL communicator is used by two threads at once.
nccl::Comm& NcclCommunicator::State::pair(int me, int peer, bool sending, std::chrono::milliseconds timeout,
                                          const std::string& what) {
  auto& comms = sending ? to_peer : from_peer;
  {
    std::lock_guard lock(p2p_mutex);
    auto found = comms.find(peer);
    if (found != comms.end()) return *found->second;
  }
  const int src = sending ? me : peer;
  const int dst = sending ? peer : me;
  const std::string key = prefix + "/p2p/" + std::to_string(src) + "-" + std::to_string(dst) + "/nccl_unique_id";
  ncclUniqueId id;
  if (sending) {
    LOCKSTEP_NCCL_CALL(ncclGetUniqueId(&id));
    store->set(key, nccl::to_hex(id));
  } else {
    id = nccl::from_hex(store->get(key, timeout), key);
  }
  std::unique_ptr<nccl::Comm> comm =
      nccl::Comm::init(id, 2, sending ? 0 : 1, timeout,
                       what + " (connecting rank " + std::to_string(src) + " to rank " + std::to_string(dst) + ")");
  std::lock_guard lock(p2p_mutex);
  return *(comms[peer] = std::move(comm));
}

void NcclCommunicator::do_send(const Tensor& tensor, int peer, int tag) {
  State& s = *state_;
  const std::string what = p2p_what("send", "to", peer, tag, tensor, rank());
  LOCKSTEP_CHECK(tensor.device() == nccl::cuda_device(s.device))
      << "nccl backend: " << what << ": the tensor is on " << tensor.device() << " but the communicator is on "
      << nccl::cuda_device(s.device) << "; copy the tensor to its GPU first";
  nccl::CurrentDevice current(s.device);
  const lockstep::cuda::CommunicationScope in_flight(s.device);  // no cudaFree while it runs
  nccl::Comm& comm = s.pair(rank(), peer, true, timeout(), what);
  cudaStream_t stream = s.sends.get();
  s.sends.follow_producers(s.device);
  P2pHeader header;
  std::memset(&header, 0, sizeof header);
  header.magic = kP2pMagic;
  header.numel = static_cast<uint64_t>(tensor.numel());
  header.tag = tag;
  header.dtype = static_cast<uint8_t>(tensor.dtype());
  std::memcpy(s.send_header_host.get(), &header, sizeof header);
  char* device_header = s.send_header.reserve(sizeof header);
  nccl::copy_async(device_header, s.send_header_host.get(), sizeof header, cudaMemcpyHostToDevice, stream);
  comm.check(ncclSend(device_header, sizeof header, ncclUint8, 1, comm.get(), stream), "ncclSend of the header", what,
             timeout());
  if (tensor.nbytes() > 0) {
    comm.check(ncclSend(nccl::device_pointer(tensor), tensor.nbytes(), ncclUint8, 1, comm.get(), stream), "ncclSend",
               what, timeout());
  }
  comm.wait(stream, what, timeout());
}

void NcclCommunicator::do_recv(const Tensor& tensor, int peer, int tag) {
  State& s = *state_;
  const std::string what = p2p_what("recv", "from", peer, tag, tensor, rank());
  LOCKSTEP_CHECK(tensor.device() == nccl::cuda_device(s.device))
      << "nccl backend: " << what << ": the tensor is on " << tensor.device() << " but the communicator is on "
      << nccl::cuda_device(s.device) << "; receive into a tensor on its GPU";
  nccl::CurrentDevice current(s.device);
  const lockstep::cuda::CommunicationScope in_flight(s.device);  // no cudaFree while it runs
  nccl::Comm& comm = s.pair(rank(), peer, false, timeout(), what);
  cudaStream_t stream = s.receives.get();
  s.receives.follow_producers(s.device);  // nothing queued before still reads the tensor
  char* device_header = s.recv_header.reserve(sizeof(P2pHeader));
  comm.check(ncclRecv(device_header, sizeof(P2pHeader), ncclUint8, 0, comm.get(), stream), "ncclRecv of the header",
             what, timeout());
  nccl::copy_async(s.recv_header_host.get(), device_header, sizeof(P2pHeader), cudaMemcpyDeviceToHost, stream);
  comm.wait(stream, what, timeout());
  P2pHeader header;
  std::memcpy(&header, s.recv_header_host.get(), sizeof header);
  LOCKSTEP_CHECK(header.magic == kP2pMagic && header.dtype <= static_cast<uint8_t>(DType::u8))
      << "nccl backend: " << what
      << ": the first message was not a lockstep send header; is another library "
         "sending on this communicator?";
  const auto sent_dtype = static_cast<DType>(header.dtype);
  const size_t sent_bytes = header.numel * dtype_size(sent_dtype);
  const bool matches =
      header.tag == tag && sent_dtype == tensor.dtype() && header.numel == static_cast<uint64_t>(tensor.numel());
  // A mismatched message is still taken (into scratch), so the sender does not hang; then
  // this rank fails.
  char* into = matches ? nccl::device_pointer(tensor) : s.drain.reserve(sent_bytes);
  if (sent_bytes > 0) {
    comm.check(ncclRecv(into, sent_bytes, ncclUint8, 0, comm.get(), stream), "ncclRecv", what, timeout());
    comm.wait(stream, what, timeout());
  }
  LOCKSTEP_CHECK(matches) << "nccl backend: " << what << ": rank " << peer << " sent tag " << header.tag << ", "
                          << header.numel << " " << dtype_name(sent_dtype) << "; send and recv must match in order, "
                          << "with the same tag, dtype and element count";
}

}  // namespace lockstep::comm
