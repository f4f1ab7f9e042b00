#include "lockstep/autograd/checkpoint.h"

#include "lockstep/autograd/node.h"

namespace lockstep::autograd {
namespace {

// Turns recording on for a scope (backward runs with it off).
class EnableGradGuard {
 public:
  EnableGradGuard() : previous_(GradMode::enabled()) { GradMode::set_enabled(true); }
  ~EnableGradGuard() { GradMode::set_enabled(previous_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x) {
  if (!GradMode::enabled() || !x.requires_grad()) return fn(x);
  Tensor y;
  {
    NoGradGuard no_grad;
    y = fn(x);
  }
  const Tensor saved = x.detach();
  record("checkpoint", {x}, {y}, [fn, saved](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
    Tensor input = saved.detach();
    input.set_requires_grad(true);
    Tensor output;
    {
      EnableGradGuard grad;
      output = fn(input);
    }
    output.backward(grads[0]);  // a pass of its own: parameters accumulate here
    return {input.grad()};
  });
  return y;
}

}  // namespace lockstep::autograd
