// Sequential: runs its children in order, each on the previous one's output, as
// torch.nn.Sequential; children are named "0", "1", ..., so parameters are "0.weight", ...
#pragma once

#include <initializer_list>
#include <memory>

#include "lockstep/nn/module.h"

namespace lockstep::nn {

class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  // Appends a layer named by its position.
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return named_children().size(); }
  const std::shared_ptr<Module>& operator[](size_t index) const;
  Tensor forward(const Tensor& x) override;
};

}  // namespace lockstep::nn
