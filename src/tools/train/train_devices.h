// What `lockstep train --devices` names: a count ("4"), a kind ("cpu", "cuda": all of
// them), or a list ("cuda:0,cuda:1"). Without the flag, and for a bare count, the kind is
// CUDA when a GPU is visible, else CPU (one CPU device per core).
#pragma once

#include <string>

#include "lockstep/core/device.h"

namespace lockstep::tools {

struct DeviceChoice {
  DeviceType type = DeviceType::cpu;
  int count = 0;  // 0: as many as the strategy can use (every GPU, or one CPU device per core)
};

// Throws UsageError with the accepted forms and, for a device that is not there, the ones
// that are. visible_gpus is cuda::device_count() (a parameter so tests can pretend).
DeviceChoice parse_devices(const std::string& text, int visible_gpus);

}  // namespace lockstep::tools
