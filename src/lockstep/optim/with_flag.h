// A run-time option made a compile-time one, so that each combination of an update's options
// is its own loop or kernel with its branches fixed (sgd.cpp's loops and the kernels of
// cuda/optimizer_kernels.cu). C++17: .cu files include it too.
#pragma once

#include <type_traits>

namespace lockstep::optim {

// Calls body(std::bool_constant<flag>{}).
template <typename Body>
void with_flag(bool flag, Body&& body) {
  if (flag) {
    body(std::true_type{});
  } else {
    body(std::false_type{});
  }
}

}  // namespace lockstep::optim
