// Points lockstep::gpu::Nvml at the test stand-in library and a profile for the lifetime
// of one object, restoring the environment afterwards. Tests of the tools that read GPUs
// (doctor, top, run --gpus) use it the same way:
//   StandinEnv env("a100-8x-nvlink.json");  // a file under tests/gpu/profiles/, or a path
//   lockstep::gpu::Nvml nvml;
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace lockstep::testing {

// The profiles shipped with the tests.
inline std::string standin_profile_path(const std::string& name) {
  return name.find('/') != std::string::npos ? name : std::string(LOCKSTEP_NVML_PROFILES) + "/" + name;
}

// Sets one environment variable (or unsets it, for nullopt) until destroyed.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value->c_str(), 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

class StandinEnv {
 public:
  explicit StandinEnv(const std::string& profile)
      : library_("LOCKSTEP_NVML_LIBRARY", std::string(LOCKSTEP_NVML_STANDIN)),
        profile_("LOCKSTEP_NVML_PROFILE", standin_profile_path(profile)) {}

 private:
  ScopedEnv library_;
  ScopedEnv profile_;
};

}  // namespace lockstep::testing
