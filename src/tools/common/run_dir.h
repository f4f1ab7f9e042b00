// Where a command's files go when the user names no folder: runs/<prefix><timestamp>.
#pragma once

#include <string>

namespace lockstep::tools {

// "runs/<prefix>YYYYmmdd-HHMMSS", with "-2", "-3", ... appended when that folder exists (two
// runs started in the same second get distinct folders). Creates nothing.
std::string fresh_run_dir(const std::string& prefix = "");

}  // namespace lockstep::tools
