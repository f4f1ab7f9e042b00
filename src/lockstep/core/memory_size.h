// Memory sizes as people write them, for flags and environment variables alike: "4096"
// (bytes), "512M", "1.5GiB", "10gb", "2T". The suffixes are binary (K = 1024), as
// nvidia-smi's MiB and free(1) -h read them, alone or with "B" or "iB", in any case.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace lockstep {

// The bytes `text` says (rounded to the nearest), or nothing when it is not such a size: no
// leading digit, a sign, a space, another suffix, or 2^63 bytes or more.
std::optional<int64_t> memory_size(const std::string& text);

}  // namespace lockstep
