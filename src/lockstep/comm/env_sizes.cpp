#include "lockstep/comm/env_sizes.h"

#include <cstdlib>

#include "lockstep/core/error.h"

namespace lockstep::comm {
namespace {

size_t byte_count(const char* name, const std::optional<std::string>& value, size_t fallback, long long minimum) {
  if (!value) return fallback;
  char* end = nullptr;
  const long long bytes = std::strtoll(value->c_str(), &end, 10);
  LOCKSTEP_CHECK(end != value->c_str() && *end == '\0' && bytes >= minimum)
      << name << " must be a byte count" << (minimum > 0 ? " of at least " + std::to_string(minimum) : "") << ", got '"
      << *value << "'";
  return static_cast<size_t>(bytes);
}

}  // namespace

std::optional<std::string> env_value(const char* name) {
  const char* text = std::getenv(name);
  return text != nullptr ? std::optional<std::string>(text) : std::nullopt;
}

size_t shm_staging_bytes(const std::optional<std::string>& value) {
  return byte_count("LOCKSTEP_SHM_STAGING_BYTES", value, size_t{4} << 20, 4096) / 64 * 64;
}

size_t direct_all_reduce_bytes(const std::optional<std::string>& value, size_t fallback) {
  return byte_count("LOCKSTEP_DIRECT_ALLREDUCE_BYTES", value, fallback, 0);
}

}  // namespace lockstep::comm
