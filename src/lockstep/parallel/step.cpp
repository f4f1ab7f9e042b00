#include "lockstep/parallel/step.h"

#include <bit>
#include <sstream>

namespace lockstep::parallel {

std::string check_step_layout(int64_t batch, int64_t micro_batch, int devices) {
  std::ostringstream error;
  if (micro_batch < 1 || batch % micro_batch != 0) {
    error << "the global batch (" << batch << ") must be a multiple of the micro-batch (" << micro_batch << ")";
    return error.str();
  }
  const int64_t leaves = batch / micro_batch;
  const int64_t per_device = leaves / devices;
  if (leaves % devices != 0 || (devices > 1 && !std::has_single_bit(static_cast<uint64_t>(per_device)))) {
    error << "a global batch of " << batch << " in micro-batches of " << micro_batch << " is " << leaves
          << " micro-batches, which " << devices
          << " devices cannot share as equal power-of-two runs (global = micro-batch x accumulation steps x devices, "
             "accumulation steps 1, 2, 4, ...; the step's tree must split at device boundaries): use a device count "
             "that leaves each device 1, 2, 4, ... micro-batches, or change --batch-size or --micro-batch";
  }
  return error.str();
}

}  // namespace lockstep::parallel
