// gpu_share_exchange.h in builds without the CUDA backend: there are no GPU devices to
// exchange between, and making an exchange says so. (With the backend,
// parallel/cuda/gpu_share_exchange.cpp implements it.)
#include "lockstep/parallel/gpu_share_exchange.h"

#if !LOCKSTEP_HAVE_CUDA

#include "lockstep/core/error.h"

namespace lockstep::parallel {

struct GpuShareExchange::State {};

GpuShareExchange::GpuShareExchange(int devices) {
  LOCKSTEP_FAIL() << "data parallelism over " << devices
                  << " CUDA devices: this build of Lockstep has no CUDA backend (it is built when nvcc and NCCL are "
                     "found; see the README)";
}

GpuShareExchange::~GpuShareExchange() = default;
void GpuShareExchange::sums_queued(int) {}
void GpuShareExchange::wait_for_sums(int) {}
void GpuShareExchange::fold(int, const std::vector<std::vector<Tensor>>&, size_t, int64_t, const Tensor&) const {}
void GpuShareExchange::updates_queued(int) {}
void GpuShareExchange::wait_for_updates(int) {}
void GpuShareExchange::copy_elements(const Tensor&, const Tensor&, int64_t, int64_t) const {}
void GpuShareExchange::drain() const noexcept {}

}  // namespace lockstep::parallel

#endif
