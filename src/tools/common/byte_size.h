// Memory sizes on the command line ("10G", "10GiB", "512M", "1.5g", "4096": the grammar of
// core/memory_size.h), and printed back.
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::tools {

// UsageError naming `flag` and the accepted forms for anything else.
uint64_t parse_byte_size(const std::string& text, const std::string& flag);

// "9.5 GiB", "512 MiB", "17 B".
std::string format_bytes(uint64_t bytes);

}  // namespace lockstep::tools
