// The message of the Error a piece of code throws, for tests of what errors say.
#pragma once

#include <functional>
#include <string>

#include "lockstep/core/error.h"

namespace lockstep::testing {

// What the Error thrown by f says, or "no error" when f returns normally (which no test's
// expected message contains, so the test fails naming it).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace lockstep::testing
