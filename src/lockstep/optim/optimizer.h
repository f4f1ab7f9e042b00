// Optimizer: updates a fixed list of parameters from their gradients, with per-parameter
// state (momentum, Adam moments) that state_dict()/load_state_dict() save and restore
// bit-exactly, so a resumed run continues as if never stopped. Updates run on raw data
// under NoGradGuard; each element's update is independent of how the work is split across
// threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/core/tensor.h"
#include "lockstep/nn/named_tensors.h"

namespace lockstep::optim {

// One kind of per-parameter state. State named `name` for parameter i is saved as
// "state.<i>.<name>". Per-element slots have the parameter's shape and dtype; the others
// are i64 scalars (step counts).
struct StateSlot {
  std::string name;
  bool per_element = true;
};

class Optimizer {
 public:
  // params: contiguous, floating-point tensors that require grad (model.parameters()),
  // each at most once. Their order numbers the state.
  Optimizer(std::vector<Tensor> params, double lr, std::vector<StateSlot> slots);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient (those without are skipped, their state
  // untouched) and counts the step.
  void step();
  // Sets every parameter's grad to undefined (PyTorch's set_to_none=True).
  void zero_grad();

  double lr() const { return lr_; }
  void set_lr(double lr);
  int64_t step_count() const { return step_count_; }
  const std::vector<Tensor>& params() const { return params_; }

  // "step" (i64 scalar: step() calls so far) then, per parameter in order, its existing
  // state slots "state.<i>.<slot>". Hyperparameters (lr, betas, ...) are not saved: they
  // come from the configuration and the LR schedule, a function of the step. The tensors
  // are the live state (no copy): serialize before the next step().
  NamedTensors state_dict() const;
  // Bytes of per-parameter state held now (what state_dict() holds but "step").
  int64_t state_bytes() const;
  // Replaces all state with copies of the given tensors. Every problem (unknown key, bad
  // parameter number, wrong shape, missing "step") is reported in one Error and nothing is
  // changed. A parameter with no entries starts fresh (as one that never had a gradient).
  void load_state_dict(const NamedTensors& state);

  // Optimizer offload (ZeRO-Offload's CPU optimizer): the state lives on `host` and the
  // update runs there. Each step copies a parameter and its gradient into host buffers,
  // updates them with the host's kernels and copies the parameter back: for GPU parameters,
  // AdamW's 8 bytes of moments per parameter leave the GPU, and 12 bytes per parameter cross
  // the bus each step. The update is elementwise and the GPU's kernels compute as the CPU's
  // (docs/architecture.md), so the bits do not change. `host` is a CPU device; state already
  // created moves there. Parameters already on `host` are stepped in place.
  void offload_to(Device host);
  // The device offload_to named; none when the state lives beside the parameters.
  std::optional<Device> offload_device() const { return offload_; }
  // Bytes of the host buffers that offload stages parameters and gradients in.
  int64_t staging_bytes() const;

  // State of parameter i in slot s (undefined until created), for sharded optimizers.
  const Tensor& state(size_t param, size_t slot) const { return state_.at(param).at(slot); }
  const std::vector<StateSlot>& slots() const { return slots_; }

 protected:
  // Updates `param` from grad (contiguous, same shape, dtype and device): params_[index], or
  // its host copy under offload. Runs under NoGradGuard.
  virtual void update(size_t index, const Tensor& param, const Tensor& grad) = 0;
  // The state tensor of (param, slot), created (zeros) on first use.
  Tensor& state_slot(size_t param, size_t slot);
  // Short name for errors: "SGD", "AdamW".
  virtual const char* name() const = 0;

  double lr_;

 private:
  // Where the state of parameter p lives: beside it, or on the offload device; a counter of
  // a GPU parameter, which the host reads every step, in host memory.
  Device state_device(const Tensor& p, bool per_element) const;
  // Offload: the host copy of parameter `index` and its gradient `grad`, updated there and
  // copied back.
  void update_on_host(size_t index, const Tensor& param, const Tensor& grad);

  std::vector<Tensor> params_;
  std::vector<StateSlot> slots_;
  std::vector<std::vector<Tensor>> state_;  // [param][slot]
  int64_t step_count_ = 0;
  std::optional<Device> offload_;
  struct Staged {
    Tensor param, grad;
  };
  std::vector<Staged> staged_;  // offload: per parameter, its host buffers (created on first step)
};

// The grain for parallel_for in elementwise update loops: below it, threads cost more than
// they save.
constexpr int64_t kUpdateGrain = int64_t{1} << 15;

// Splits "state.<index>.<slot>" into its parameter index and slot name; false for any
// other key (such as "step").
bool parse_state_key(const std::string& key, size_t& index, std::string& slot);
// The key of parameter `index`'s state in `slot`: "state.<index>.<slot>".
std::string state_key(size_t index, const std::string& slot);

}  // namespace lockstep::optim
