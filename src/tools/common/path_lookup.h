// Finding a program as a shell would: on PATH, or as a path when the name has a slash.
#pragma once

#include <string>

namespace lockstep::tools {

// The first executable `program` in the colon-separated `path_env`, or, when `program`
// names a path, that file if it is executable; empty when there is none.
std::string find_on_path(const std::string& path_env, const std::string& program);

}  // namespace lockstep::tools
