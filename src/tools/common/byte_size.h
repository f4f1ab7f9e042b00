// Memory sizes on the command line: "10G", "10GiB", "512M", "1.5g", "4096" (bytes).
// Suffixes are binary (K = 1024), as nvidia-smi's MiB and free(1) -h read them.
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::tools {

// UsageError naming `flag` and the accepted forms for anything else.
uint64_t parse_byte_size(const std::string& text, const std::string& flag);

// "9.5 GiB", "512 MiB", "17 B".
std::string format_bytes(uint64_t bytes);

}  // namespace lockstep::tools
