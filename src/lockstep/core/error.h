// Errors: every failure a user can cause is a lockstep::Error whose message says what was
// wrong, the value, and how to fix it. LOCKSTEP_CHECK guards invariants and user input alike:
//   LOCKSTEP_CHECK(n > 0) << "batch size must be positive, got " << n;
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace lockstep {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Bad command-line usage: the CLI exits with 2 instead of 1.
class UsageError : public Error {
 public:
  using Error::Error;
};

// A device had no memory left for an allocation: the GPU's (or a CPU device's under
// LOCKSTEP_CPU_DEVICE_MEMORY, core/allocator.h) or the host's. A training loop may catch it
// to retry a step with a smaller micro-batch (parallel/layout.h says when that is safe).
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

namespace detail {

// Collects a message with operator<< and throws it when the statement ends.
class ErrorBuilder {
 public:
  ErrorBuilder() = default;
  ErrorBuilder(const ErrorBuilder&) = delete;
  ErrorBuilder& operator=(const ErrorBuilder&) = delete;
  ~ErrorBuilder() noexcept(false) { throw Error(stream_.str()); }
  template <typename T>
  ErrorBuilder& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

}  // namespace detail
}  // namespace lockstep

// `if` form so the message is only built when the check fails.
#define LOCKSTEP_CHECK(cond) \
  if (cond) {                \
  } else                     \
    ::lockstep::detail::ErrorBuilder()

#define LOCKSTEP_FAIL() ::lockstep::detail::ErrorBuilder()
