// NVML, loaded at run time with dlopen so that one lockstep binary runs on hosts with no
// NVIDIA driver. Only the functions used are declared (nvml_abi.h); the newest versioned
// entry points are preferred and optional ones may be missing, as in nvtop.
//
// The library is the driver's `libnvidia-ml.so.1`, never the unversioned name (which can
// find the CUDA toolkit's stub and report "no GPU"), unless LOCKSTEP_NVML_LIBRARY names
// another file: the tests point it at the stand-in library under tests/gpu/, which answers
// from the profile file that LOCKSTEP_NVML_PROFILE names.
#pragma once

#include <memory>
#include <string>

#include "lockstep/gpu/gpu_state.h"

namespace lockstep::gpu {

class Nvml {
 public:
  // Loads and initializes NVML. Never throws: when there is no library, no driver or
  // nvmlInit fails, loaded() is false and load_error() says what and which file.
  Nvml();
  ~Nvml();  // nvmlShutdown and dlclose
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // The file dlopen is asked for: LOCKSTEP_NVML_LIBRARY, else libnvidia-ml.so.1.
  static std::string requested_library();

  bool loaded() const;
  const std::string& library_path() const;  // the file dlopen found (resolved path)
  const std::string& load_error() const;

  struct Query {
    bool processes = true;  // compute processes on each GPU, with user and command from /proc
    bool topology = false;  // GPU-to-GPU paths (NVLink count or PCIe common ancestor)
  };
  // One reading of every GPU. GPM's activity (Hopper and later) spans two readings, so it
  // comes from this object's second reading on. Without NVML: an empty state carrying library_path and
  // load_error. A required call that fails (count, handles) is an Error naming the call
  // and NVML's message; an optional one leaves its field empty and is listed in the
  // device's `unavailable`.
  GpuState read(const Query& query) const;
  GpuState read() const { return read(Query{}); }

 private:
  struct Library;
  std::unique_ptr<Library> library_;
};

}  // namespace lockstep::gpu
