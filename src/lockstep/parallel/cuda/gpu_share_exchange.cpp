#include "lockstep/parallel/gpu_share_exchange.h"

#include "lockstep/comm/cuda/tree_reduce_kernel.h"
#include "lockstep/core/cuda/peer_access.h"
#include "lockstep/core/cuda/runtime.h"
#include "lockstep/core/cuda/stream_event.h"

namespace lockstep::parallel {
namespace {

Device cuda_device(size_t index) { return Device(DeviceType::cuda, static_cast<int>(index)); }

// Elements [begin, begin + count) of a contiguous tensor on a GPU, as a device address.
char* elements_at(const Tensor& t, int64_t begin) {
  return static_cast<char*>(t.data_ptr()) + begin * static_cast<int64_t>(dtype_size(t.dtype()));
}

}  // namespace

struct GpuShareExchange::State {
  std::vector<int> gpu;                        // per device: the CUDA ordinal it runs on
  std::vector<std::vector<bool>> reads_peer;   // [reader][owner]: the reader's kernels can read the owner's memory
  std::vector<cuda::StreamEvent> sums_done;    // per device: its sums are computed
  std::vector<cuda::StreamEvent> update_done;  // per device: its optimizer has updated its shares
};

GpuShareExchange::GpuShareExchange(int devices) : state_(std::make_unique<State>()) {
  LOCKSTEP_CHECK(devices >= 1 && devices <= comm::cuda::kMaxTreeReduceInputs)
      << "data parallelism in one process folds the sums of 1 to " << comm::cuda::kMaxTreeReduceInputs
      << " GPU devices, got " << devices
      << ": use fewer devices (LOCKSTEP_CUDA_DEVICES_PER_GPU multiplies them), or one process per GPU "
         "(DistributedDataParallel, lockstep train --strategy ddp)";
  const auto n = static_cast<size_t>(devices);
  for (size_t d = 0; d < n; ++d) {
    state_->gpu.push_back(cuda::physical_device(cuda_device(d)));
    state_->sums_done.emplace_back(cuda_device(d));
    state_->update_done.emplace_back(cuda_device(d));
  }
  state_->reads_peer.assign(n, std::vector<bool>(n));
  for (size_t reader = 0; reader < n; ++reader)
    for (size_t owner = 0; owner < n; ++owner)
      state_->reads_peer[reader][owner] = cuda::can_read_peer_memory(state_->gpu[reader], state_->gpu[owner]);
}

GpuShareExchange::~GpuShareExchange() = default;

void GpuShareExchange::sums_queued(int device) { state_->sums_done.at(static_cast<size_t>(device)).record(); }

void GpuShareExchange::wait_for_sums(int device) {
  for (const cuda::StreamEvent& done : state_->sums_done) done.wait_in(cuda_device(static_cast<size_t>(device)));
}

void GpuShareExchange::updates_queued(int device) { state_->update_done.at(static_cast<size_t>(device)).record(); }

void GpuShareExchange::wait_for_updates(int device) {
  for (const cuda::StreamEvent& done : state_->update_done) done.wait_in(cuda_device(static_cast<size_t>(device)));
}

void GpuShareExchange::fold(int device, const std::vector<std::vector<Tensor>>& sums, size_t index, int64_t begin,
                            const Tensor& out) const {
  const auto d = static_cast<size_t>(device);
  const Device here = cuda_device(d);
  LOCKSTEP_CHECK(sums.size() == state_->gpu.size()) << "GpuShareExchange::fold got the sums of " << sums.size()
                                                    << " devices for an exchange between " << state_->gpu.size();
  const Tensor& own = sums[d].at(index);
  const int64_t count = out.numel();
  LOCKSTEP_CHECK(out.is_contiguous() && out.device() == here && out.dtype() == own.dtype() && begin >= 0 &&
                 begin + count <= own.numel())
      << "GpuShareExchange::fold: the fold of elements [" << begin << ", " << begin + count << ") of sum " << index
      << " (" << own.numel() << " " << dtype_name(own.dtype()) << ") on " << here << " cannot go into a "
      << dtype_name(out.dtype()) << " tensor on " << out.device() << (out.is_contiguous() ? "" : " that is strided");
  if (count == 0) return;
  const cuda::OnDevice on(here);
  std::vector<const void*> inputs(sums.size());
  // Peer copies of what this GPU cannot read where it lies. They are released on return,
  // with the fold only queued: the allocator hands their memory out again only to work
  // queued later on this device's stream, which runs after the fold.
  std::vector<Tensor> copies;
  copies.reserve(sums.size());
  for (size_t e = 0; e < sums.size(); ++e) {
    const Tensor& sum = sums[e].at(index);
    LOCKSTEP_CHECK(sum.device() == cuda_device(e) && sum.is_contiguous() && sum.dtype() == own.dtype() &&
                   sum.numel() == own.numel())
        << "GpuShareExchange::fold: device " << e << "'s sum " << index << " is " << sum.numel() << " "
        << dtype_name(sum.dtype()) << (sum.is_contiguous() ? "" : " strided") << " on " << sum.device() << ", device "
        << d << "'s " << own.numel() << " " << dtype_name(own.dtype())
        << ": every device's sums must be contiguous, alike, and on its own GPU device";
    if (state_->reads_peer[d][e]) {
      inputs[e] = elements_at(sum, begin);
      continue;
    }
    const Tensor& copy = copies.emplace_back(Tensor::empty({count}, own.dtype(), here));
    LOCKSTEP_CUDA_CHECK(cudaMemcpyPeerAsync(copy.data_ptr(), state_->gpu[d], elements_at(sum, begin), state_->gpu[e],
                                            copy.nbytes(), on.stream()));
    inputs[e] = copy.data_ptr();
  }
  comm::cuda::tree_reduce_inputs(inputs.data(), static_cast<int>(inputs.size()), out.data_ptr(), count, own.dtype(),
                                 comm::ReduceOp::sum, on.stream());
}

void GpuShareExchange::copy_elements(const Tensor& from, const Tensor& to, int64_t begin, int64_t count) const {
  LOCKSTEP_CHECK(from.device().is_cuda() && to.device().is_cuda() && from.is_contiguous() && to.is_contiguous() &&
                 from.dtype() == to.dtype() && from.numel() == to.numel() && begin >= 0 && begin + count <= to.numel())
      << "GpuShareExchange::copy_elements: elements [" << begin << ", " << begin + count << ") of "
      << shape_str(from.shape()) << " " << dtype_name(from.dtype()) << " on " << from.device() << " into "
      << shape_str(to.shape()) << " " << dtype_name(to.dtype()) << " on " << to.device()
      << ": both must be contiguous tensors of one shape and dtype on GPU devices";
  if (count == 0) return;
  const size_t bytes = static_cast<size_t>(count) * dtype_size(to.dtype());
  const int from_gpu = cuda::physical_device(from.device()), to_gpu = cuda::physical_device(to.device());
  const cuda::OnDevice on(to.device());
  if (from_gpu == to_gpu) {
    LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(elements_at(to, begin), elements_at(from, begin), bytes,
                                        cudaMemcpyDeviceToDevice, on.stream()));
  } else {
    LOCKSTEP_CUDA_CHECK(
        cudaMemcpyPeerAsync(elements_at(to, begin), to_gpu, elements_at(from, begin), from_gpu, bytes, on.stream()));
  }
}

void GpuShareExchange::drain() const noexcept {
  for (size_t d = 0; d < state_->gpu.size(); ++d) {
    try {
      cuda::synchronize(cuda_device(d));
    } catch (...) {  // the step's own error says what went wrong
    }
  }
}

}  // namespace lockstep::parallel
