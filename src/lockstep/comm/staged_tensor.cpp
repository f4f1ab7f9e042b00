#include "lockstep/comm/staged_tensor.h"

namespace lockstep::comm {

StagedTensor::StagedTensor(const Tensor& tensor, Device memory, bool reads) : given_(tensor) {
  if (tensor.device().type() == memory.type()) {
    staged_ = tensor;
  } else {
    staged_ = reads ? tensor.to(memory) : Tensor::empty(tensor.shape(), tensor.dtype(), memory);
  }
}

void StagedTensor::write_back() const {
  if (staged_.storage() != given_.storage()) given_.copy_from(staged_);
}

}  // namespace lockstep::comm
