#include "lockstep/nn/sequential.h"

#include <string>

namespace lockstep::nn {

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) : Module("Sequential") {
  for (const auto& module : modules) push_back(module);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(size()), std::move(module));
}

const std::shared_ptr<Module>& Sequential::operator[](size_t index) const {
  LOCKSTEP_CHECK(index < size()) << "Sequential: index " << index << " is out of range for " << size() << " layers";
  return named_children()[index].second;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor out = x;
  for (const auto& entry : named_children()) out = (*entry.second)(out);
  return out;
}

}  // namespace lockstep::nn
