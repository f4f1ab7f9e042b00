#include "lockstep/io/weights_sha256.h"

#include "lockstep/io/sha256.h"

namespace lockstep {

std::string weights_sha256(const nn::Module& model) {
  Sha256 hash;
  for (const auto& [name, tensor] : model.state_dict()) hash.update(tensor);
  return hash.hex_digest();
}

}  // namespace lockstep
