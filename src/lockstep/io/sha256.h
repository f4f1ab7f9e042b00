// SHA-256 (through OpenSSL's libcrypto) for fingerprinting weights: two runs are the same
// run when their weights_sha256 agree, whatever the device count.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "lockstep/core/tensor.h"

namespace lockstep {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t size);
  // Adds a tensor's elements in logical (row-major) order as raw little-endian bytes.
  void update(const Tensor& tensor);
  std::string hex_digest();  // finishes the hash

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string sha256_hex(const void* data, size_t size);

}  // namespace lockstep
