// Module: a tree of layers owning named parameters and buffers, as torch.nn.Module. The
// names and their order (own parameters, own buffers, then children, depth first, in
// registration order) equal PyTorch's for the same tree, so state_dicts move between
// Lockstep and PyTorch unchanged.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/core/philox.h"
#include "lockstep/core/tensor.h"
#include "lockstep/nn/named_tensors.h"

namespace lockstep::nn {

// What a forward pass needs to know about the batch it runs on, beyond the input: random
// layers (Dropout) key their draws by it so a sample's mask depends only on (seed, step,
// global sample index), never on the device or micro-batch that holds it. The training loop
// sets it on the root before each forward: model.set_forward_context({seed, step, first}).
struct ForwardContext {
  uint64_t seed = 0;
  uint64_t step = 0;         // optimizer step the forward belongs to
  int64_t first_sample = 0;  // global index of the input's first sample (axis 0)
};

class Module {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Throws unless overridden: containers without a forward of their own are fine.
  virtual Tensor forward(const Tensor& x);
  // forward(x) between this module's forward hooks, if it has any. Containers call their
  // children this way, so a layout that gathers a child's parameters just before its
  // forward and frees them after (ZeRO-3) sees every call.
  Tensor operator()(const Tensor& x);

  // Runs before every call through operator(), and after it on its result, whose
  // replacement it returns (PyTorch's forward pre-hook and forward hook). One pair per
  // module; empty functions remove them.
  using ForwardPreHook = std::function<void()>;
  using ForwardHook = std::function<Tensor(const Tensor& output)>;
  void set_forward_hooks(ForwardPreHook before, ForwardHook after);

  // Runs before this module's parameters are read or written through it, so that a writer
  // that runs in the background (optimizer offload's overlapped update,
  // optim/optimizer_read_guard.h) can finish first: whole = false first in operator(), before
  // the forward hooks (forward reads the module's own parameters); whole = true in
  // named_parameters(), parameters(), state_dict(), load_state_dict() and to(), which hand
  // out or change every parameter below the module. One per module; empty removes it.
  using ParameterAccessHook = std::function<void(bool whole)>;
  void set_parameter_access_hook(ParameterAccessHook hook);
  bool has_parameter_access_hook() const { return static_cast<bool>(before_parameter_access_); }

  // "Linear", "Sequential", ...: names the module in error messages.
  const std::string& type_name() const { return type_name_; }

  // --- registration (names: non-empty, no '.', unique among this module's parameters,
  // buffers and children) ---
  // Marks the tensor requires_grad and returns it. Layers keep the returned handle as a
  // member; replace values with copy_from, never by assigning a new tensor to the member.
  Tensor register_parameter(const std::string& name, Tensor tensor);
  // A tensor saved in the state_dict but not trained (running statistics, ...).
  Tensor register_buffer(const std::string& name, Tensor tensor);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // --- traversal (dotted names, "conv1.weight") ---
  // Depth first: own parameters, then each child's, in registration order. A tensor
  // registered twice (tied weights) is listed once, under its first name, as PyTorch does.
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;
  // This module's own entries only.
  const NamedTensors& own_parameters() const { return parameters_; }
  const NamedTensors& own_buffers() const { return buffers_; }
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  // Every module, this one first (named ""), depth first.
  std::vector<std::pair<std::string, Module*>> named_modules();
  int64_t num_parameters() const;  // elements over all parameters

  // --- state ---
  // Per module, depth first: own parameters then own buffers (PyTorch's order). Detached
  // handles to the live tensors: serialize before changing the weights.
  NamedTensors state_dict() const;
  // Copies each value into the existing tensor (same shape; dtype converted), without
  // reallocation or autograd. Keys may all carry a leading "module." (a checkpoint saved
  // from a DDP-wrapped model); it is stripped. Shape mismatches, duplicate keys and, when
  // strict, missing and unexpected keys are reported together in one Error and nothing is
  // copied.
  void load_state_dict(const NamedTensors& state, bool strict = true);

  // --- mode ---
  void train(bool on = true);  // this module and every descendant
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Sets every parameter's grad to undefined (PyTorch's zero_grad(set_to_none=True)).
  void zero_grad();
  // Moves every parameter and buffer to device in place (PyTorch's module.to(device)): the
  // tensors stay the same objects, so optimizers and hooks made later, or before, see them there.
  void to(Device device);

  // Sets the context on this module and every descendant, and numbers the modules that
  // draw random numbers (uses_randomness()) depth first, so each has its own stream.
  void set_forward_context(const ForwardContext& context);
  bool has_forward_context() const { return has_context_; }
  const ForwardContext& forward_context() const { return context_; }
  // Position of this module among the random ones of the tree set_forward_context was
  // last called on.
  int64_t random_layer_index() const { return random_layer_index_; }
  virtual bool uses_randomness() const { return false; }

  // --- running statistics folded once per step (BatchNorm's running mean and variance) ---
  // Outside a layout a module with running statistics updates them at every training
  // forward, as PyTorch's do. A parallel layout defers them: a training forward then only
  // adds its batch's statistics to a pending sum, which the layout takes after every
  // micro-batch (take_step_statistics: tensors of fixed shapes that it leaves zeroed — among
  // them the count of forwards they sum; none for a module without statistics), folds in
  // the step's tree order over the whole global batch, and hands to every replica's module
  // once per step (apply_step_statistics), so the running statistics are the same bits on
  // any device count.
  void defer_step_statistics(bool on = true);  // this module and every descendant
  bool defers_step_statistics() const { return defer_statistics_; }
  virtual std::vector<Tensor> take_step_statistics() { return {}; }
  virtual void apply_step_statistics(const std::vector<Tensor>& /*sums*/) {}

  // Fills one of this module's own parameters (name as registered) with its default
  // initialization, drawing from rng. nn::initialize calls it; layers override it.
  virtual void reset_parameter(const std::string& name, const Tensor& parameter, Philox& rng);

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name, const char* what) const;
  void collect_parameters(const std::string& prefix, NamedTensors& out, std::vector<const TensorImpl*>& seen) const;
  // named_parameters() without the access hook's wait, for what reads no value (shapes,
  // gradients: num_parameters, zero_grad).
  NamedTensors named_parameters_unwaited() const;
  void collect_buffers(const std::string& prefix, NamedTensors& out) const;
  void collect_state(const std::string& prefix, NamedTensors& out) const;
  void collect_modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out);

  std::string type_name_;
  ForwardPreHook before_forward_;
  ForwardHook after_forward_;
  ParameterAccessHook before_parameter_access_;
  NamedTensors parameters_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  bool defer_statistics_ = false;
  bool has_context_ = false;
  ForwardContext context_;
  int64_t random_layer_index_ = -1;
};

}  // namespace lockstep::nn
