#include "lockstep/io/sha256.h"

#include <openssl/evp.h>

namespace lockstep {

struct Sha256::State {
  EVP_MD_CTX* context = nullptr;
};

Sha256::Sha256() : state_(std::make_unique<State>()) {
  state_->context = EVP_MD_CTX_new();
  LOCKSTEP_CHECK(state_->context != nullptr && EVP_DigestInit_ex(state_->context, EVP_sha256(), nullptr) == 1)
      << "SHA-256: OpenSSL could not initialize a digest";
}

Sha256::~Sha256() { EVP_MD_CTX_free(state_->context); }

void Sha256::update(const void* data, size_t size) {
  LOCKSTEP_CHECK(EVP_DigestUpdate(state_->context, data, size) == 1) << "SHA-256: digest update failed";
}

void Sha256::update(const Tensor& tensor) {
  const Tensor dense = tensor.is_contiguous() && tensor.device().is_cpu() ? tensor : [&] {
    Tensor copy = Tensor::empty(tensor.shape(), tensor.dtype());  // on the host, from any device
    copy.copy_from(tensor);
    return copy;
  }();
  update(dense.raw_data(), dense.nbytes());  // x86-64 and ARM64 hosts are little-endian
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  LOCKSTEP_CHECK(EVP_DigestFinal_ex(state_->context, digest, &length) == 1) << "SHA-256: digest failed";
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

std::string sha256_hex(const void* data, size_t size) {
  Sha256 hash;
  hash.update(data, size);
  return hash.hex_digest();
}

}  // namespace lockstep
