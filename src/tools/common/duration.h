// A duration flag's value: seconds as a plain number or with a unit, "90", "90s", "10m",
// "1.5h", as Slurm and systemd users write them.
#pragma once

#include <string>

namespace lockstep::tools {

// Seconds; UsageError naming the flag and the accepted forms for anything else, or for a
// duration that is not positive.
double parse_duration(const std::string& flag, const std::string& text);

}  // namespace lockstep::tools
