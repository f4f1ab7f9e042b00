// The builds are as the projects publish them: PyTorch's wheel index
// (download.pytorch.org/whl/cuXYZ, one set of CUDA variants per release), TensorFlow's
// tested build configurations (2.14 and later install CUDA 12 wheels with
// `tensorflow[and-cuda]`; 2.11 to 2.13 were built for CUDA 11.8), and JAX's `jax[cuda12]`
// and `jax[cuda13]` extras.
#include "tools/doctor/framework_builds.h"

#include <cstdio>
#include <map>
#include <vector>

#include "lockstep/gpu/build_info.h"
#include "tools/doctor/doctor_checks.h"

namespace lockstep::tools {
namespace {

// PyTorch release (major * 100 + minor) -> its CUDA wheel variants, oldest first.
const std::map<int, std::vector<int>>& torch_variants() {
  static const std::map<int, std::vector<int>> table = {
      {113, {11060, 11070}},        {200, {11070, 11080}},        {201, {11080, 12010}},
      {202, {11080, 12010}},        {203, {11080, 12010}},        {204, {11080, 12010, 12040}},
      {205, {11080, 12010, 12040}}, {206, {11080, 12040, 12060}}, {207, {11080, 12060, 12080}},
      {208, {12060, 12080, 12090}}, {209, {12060, 12080, 13000}},
  };
  return table;
}

// "2.3.1+cu121" -> 203; -1 when it is not a version.
int release_of(const std::string& version) {
  int major = 0, minor = 0;
  if (std::sscanf(version.c_str(), "%d.%d", &major, &minor) != 2) return -1;
  return major * 100 + minor;
}

// The requirement that keeps the installed release: "torch==2.3.1" for "2.3.1+cu121"; a
// build no index has (Debian's "1.13.0a0") keeps only its release: 'torch==1.13.*'.
std::string pinned(const std::string& name, const std::string& version) {
  const std::string public_part = version.substr(0, version.find('+'));
  if (public_part.empty()) return name;
  if (public_part.find_first_not_of("0123456789.") == std::string::npos) return name + "==" + public_part;
  const int release = release_of(version);
  if (release < 0) return name;
  return "'" + name + "==" + std::to_string(release / 100) + "." + std::to_string(release % 100) + ".*'";
}

std::string cu_tag(int cuda) { return "cu" + std::to_string(cuda / 1000) + std::to_string(cuda % 1000 / 10); }

// The best variant for the driver: the newest it fully supports, else the newest of its
// CUDA major (minor-version compatibility); 0 when none runs.
int best_variant(const std::vector<int>& variants, int driver_cuda) {
  int full = 0, same_major = 0;
  for (int v : variants) {
    if (v <= driver_cuda) full = v;
    if (v / 1000 == driver_cuda / 1000) same_major = v;
  }
  return full != 0 ? full : same_major;
}

std::string driver_upgrade(int cuda) {
  const std::string minimum = minimum_driver_for_cuda_major(cuda / 1000);
  return "upgrade the NVIDIA driver" + (minimum.empty() ? std::string() : " to " + minimum + " or newer");
}

std::string torch_fix(const std::string& version, int driver_cuda, const std::string& pip) {
  const auto& table = torch_variants();
  const int release = release_of(version);
  const auto own = table.find(release);
  const std::string index = " --index-url https://download.pytorch.org/whl/";
  if (driver_cuda == 0) {
    // No driver to fit: the release's newest build, whose driver the GPU server must have.
    const int newest = own != table.end() ? own->second.back() : table.rbegin()->second.back();
    return pip + " " + pinned("torch", version) + index + cu_tag(newest) + " (needs a driver for CUDA " +
           gpu::cuda_version_string(newest) + "; pytorch.org/get-started/locally lists the other builds)";
  }
  if (own != table.end()) {
    const int variant = best_variant(own->second, driver_cuda);
    if (variant != 0) return pip + " " + pinned("torch", version) + index + cu_tag(variant);
  }
  if (own == table.end() && release > table.rbegin()->first) {
    return pip + " " + pinned("torch", version) + index + "cuXYZ, with the newest cuXYZ up to " + cu_tag(driver_cuda) +
           " that pytorch.org/get-started/locally lists for this release";
  }
  // The installed release has no build for this driver: the newest release that has one.
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    const int variant = best_variant(it->second, driver_cuda);
    if (variant == 0) continue;
    const std::string older = std::to_string(it->first / 100) + "." + std::to_string(it->first % 100);
    return pip + " 'torch==" + older + ".*'" + index + cu_tag(variant) + " (torch " + older +
           " is the newest release built for this driver), or " +
           driver_upgrade(own != table.end() ? own->second.front() : 12000);
  }
  return driver_upgrade(own != table.end() ? own->second.front() : 12000) + ": no torch release is built for CUDA " +
         std::to_string(driver_cuda / 1000) + ".x";
}

std::string tensorflow_fix(const std::string& version, int driver_cuda, const std::string& pip) {
  if (driver_cuda == 0 || driver_cuda >= 12000) {
    const std::string requirement =
        release_of(version) >= 214 ? pinned("tensorflow[and-cuda]", version) : "tensorflow[and-cuda]";
    return pip + " " + (requirement.front() == '\'' ? requirement : "'" + requirement + "'") +
           " (TensorFlow 2.14 and later bring their CUDA 12 libraries as wheels)";
  }
  if (driver_cuda >= 11000) {
    return pip + " 'tensorflow==2.13.*' (built for CUDA 11.8; it needs CUDA 11.8 and cuDNN 8.6 installed), or " +
           driver_upgrade(12000) + " for a current TensorFlow";
  }
  return driver_upgrade(12000) + ": TensorFlow 2.11 and later need CUDA 11.8 or 12";
}

std::string jax_fix(int driver_cuda, const std::string& pip) {
  if (driver_cuda >= 13000) return pip + " -U 'jax[cuda13]'";
  if (driver_cuda >= 12000 || driver_cuda == 0) return pip + " -U 'jax[cuda12]'";
  return driver_upgrade(12000) + ", then " + pip + " -U 'jax[cuda12]' (current JAX builds are for CUDA 12 and 13)";
}

}  // namespace

int parse_cuda_version(const std::string& text) {
  int major = 0, minor = 0;
  const int parsed = std::sscanf(text.c_str(), "%d.%d", &major, &minor);
  if (parsed < 1 || major <= 0) return 0;
  return major * 1000 + (parsed == 2 ? minor * 10 : 0);
}

std::string cuda_build_fix(const std::string& framework, const std::string& version, int driver_cuda,
                           const std::string& pip) {
  if (framework == "torch") return torch_fix(version, driver_cuda, pip);
  if (framework == "tensorflow") return tensorflow_fix(version, driver_cuda, pip);
  if (framework == "jax") return jax_fix(driver_cuda, pip);
  return "install a build of " + framework + " for CUDA " + std::to_string(driver_cuda / 1000) + ".x";
}

}  // namespace lockstep::tools
