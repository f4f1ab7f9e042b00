// Which CUDA builds each framework publishes, for the one-line fixes of the Python checks:
// the package a user installs so the framework runs on this driver.
#pragma once

#include <string>

namespace lockstep::tools {

// "12.1" -> 12010, "12" -> 12000, "11.8.0" -> 11080 (CUDA's 1000 * major + 10 * minor);
// 0 when the text is not a version.
int parse_cuda_version(const std::string& text);

// The command that installs a CUDA build of `framework` ("torch", "tensorflow", "jax") that
// runs on a driver for CUDA `driver_cuda` (12020 = 12.2), keeping the installed `version`
// when a build of it fits; when none does, what to do instead (an older release, or a newer
// driver). `driver_cuda` 0: no driver to fit. `pip` installs for the user's interpreter
// ("/venv/bin/python -m pip install").
std::string cuda_build_fix(const std::string& framework, const std::string& version, int driver_cuda,
                           const std::string& pip);

}  // namespace lockstep::tools
