// The CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER rule. CUDA reads the list left to right and
// silently stops at the first entry it cannot use, so "0,1,9" on an 8-GPU host gives two
// GPUs and no error; and it numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID,
// so cuda:0 need not be nvidia-smi's GPU 0 on a mixed host. gpu::cuda_devices applies
// CUDA's rules; this turns what it finds into a status and a fix.
#include <algorithm>

#include "lockstep/gpu/device_order.h"
#include "tools/doctor/doctor_checks.h"

namespace lockstep::tools {

Check check_visible_devices(const DoctorInput& in) {
  Check c{"visible-devices", Status::kPass, "", "", {}};
  const std::optional<std::string>& list = in.env.cuda_visible_devices;
  const gpu::CudaDevices cuda = gpu::cuda_devices(in.gpus, list, in.env.cuda_device_order);
  for (size_t k = 0; k < cuda.visible.size(); ++k) {
    const gpu::GpuDevice& d = in.gpus.devices[cuda.visible[k]];
    c.details.push_back("cuda:" + std::to_string(k) + " = NVML GPU " + std::to_string(d.index) + " (" + d.name + ")");
  }
  const std::string shown = list ? "CUDA_VISIBLE_DEVICES='" + *list + "'" : "CUDA_VISIBLE_DEVICES is not set";
  if (cuda.problems.empty()) {
    c.summary = shown + "; CUDA sees " + std::to_string(cuda.visible.size()) + " GPU" +
                (cuda.visible.size() == 1 ? "" : "s") + ", numbered as nvidia-smi numbers them";
    return c;
  }
  c.status = Status::kWarn;
  c.summary = shown;
  for (const std::string& problem : cuda.problems) c.summary += "; " + problem;
  const bool list_problem = std::any_of(cuda.problems.begin(), cuda.problems.end(),
                                        [](const std::string& p) { return p.rfind("CUDA_VISIBLE_DEVICES", 0) == 0; });
  if (list && list->empty()) {
    c.fix = "unset CUDA_VISIBLE_DEVICES to use the GPUs, or leave it empty on purpose to run on CPU devices";
  } else if (list_problem) {
    // Entries were given and CUDA can use none of them: every GPU program here runs on CPU or fails.
    if (cuda.visible.empty()) c.status = Status::kFail;
    c.fix = "list only GPUs that exist, each once: indices 0-" + std::to_string(in.gpus.devices.size() - 1) +
            " or UUIDs from nvidia-smi -L";
  } else {
    c.fix = "export CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA and nvidia-smi number the GPUs alike";
  }
  return c;
}

}  // namespace lockstep::tools
