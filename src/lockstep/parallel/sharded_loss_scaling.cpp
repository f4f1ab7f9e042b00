#include "lockstep/parallel/sharded_loss_scaling.h"

namespace lockstep::parallel {

UpdateGate loss_scaled_gate(optim::LossScaler& scaler, comm::Communicator& comm, bool* skipped) {
  return [&scaler, &comm, skipped](const std::vector<Tensor>& grads) {
    const bool mine = scaler.unscale(grads);
    // Any rank's inf or NaN skips every rank's step.
    const Tensor overflowed = Tensor::full({1}, mine ? 0.0 : 1.0, DType::f64);
    comm.all_reduce(overflowed, comm::ReduceOp::max);
    const bool finite = overflowed.item() == 0.0;
    scaler.update(finite);
    if (skipped) *skipped = !finite;
    return finite;
  };
}

}  // namespace lockstep::parallel
