// Byte counts the one-host backends take from the environment, parsed in one place (the
// backends and `lockstep doctor` read the same values). A value that is not a whole number
// at or above the minimum is an Error naming the variable and the value.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace lockstep::comm {

// The variable's value, nullopt when it is unset.
std::optional<std::string> env_value(const char* name);

// LOCKSTEP_SHM_STAGING_BYTES: each shm rank's staging segment (default 4 MiB, at least
// 4096, rounded down to 64 bytes).
size_t shm_staging_bytes(const std::optional<std::string>& value);
// LOCKSTEP_DIRECT_ALLREDUCE_BYTES: up to this size an all-reduce folds everything on every
// rank instead of one slice each (default kDirectAllReduceBytes).
size_t direct_all_reduce_bytes(const std::optional<std::string>& value, size_t fallback);

}  // namespace lockstep::comm
