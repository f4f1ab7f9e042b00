// Optimizer: updates a fixed list of parameters from their gradients, with per-parameter
// state (momentum, Adam moments) that state_dict()/load_state_dict() save and restore
// bit-exactly, so a resumed run continues as if never stopped. Updates run on raw data
// under NoGradGuard; each element's update is independent of how the work is split across
// threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/core/tensor.h"
#include "lockstep/nn/named_tensors.h"

namespace lockstep::optim {

class BackgroundUpdates;
class ParameterReadGuard;

// How an offloaded optimizer steps (Optimizer::offload_to).
enum class OffloadUpdates {
  // Inside step(): it returns with every parameter updated.
  synchronous,
  // In the background, overlapped with what the caller does next (the next forward), where a
  // ParameterReadGuard (optimizer_read_guard.h) makes every reader of the parameters wait
  // for their update; the layouts that can, install one. Without one, as synchronous.
  overlapped,
};

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
  // Waits for an overlapped update still in flight. A ParameterReadGuard over this optimizer
  // must go first (the layouts that make one declare it after their optimizers).
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient (those without are skipped, their state
  // untouched) and counts the step. Under overlapped offload it returns once the gradients
  // are copied to the host and the rest is queued (see offload_to).
  void step();
  // Sets every parameter's grad to undefined (PyTorch's set_to_none=True). Does not wait for
  // an overlapped update: step() has copied the gradients it reads before returning.
  void zero_grad();

  double lr() const { return lr_; }
  void set_lr(double lr);
  int64_t step_count() const { return step_count_; }
  const std::vector<Tensor>& params() const;

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
  // created moves there. Parameters already on `host` are stepped in place, inside step().
  //
  // Overlapped (where a ParameterReadGuard covers the parameters): step() copies the
  // gradients to the host (the caller may reuse their memory at once) and queues the rest on
  // this optimizer's worker thread, which reads each parameter, updates it and writes it back
  // in parameter order. Every call here that reads or writes the parameters or the state
  // (step, set_lr, params, state, state_dict, load_state_dict, state_bytes, staging_bytes,
  // offload_to) waits for it first, and the guard makes the model's readers wait. The same
  // code updates the same bytes, so the bits are the synchronous ones. An error in the
  // background is thrown by the next wait, and by every one after it (the weights are partly
  // updated).
  void offload_to(Device host, OffloadUpdates updates = OffloadUpdates::overlapped);
  // The device offload_to named; none when the state lives beside the parameters.
  std::optional<Device> offload_device() const { return offload_; }
  // Whether step() leaves the host's update running in the background now: offloaded,
  // overlapped, and a ParameterReadGuard covers the parameters.
  bool overlaps_updates() const;
  // Returns once the update of parameter `index` by the last step() has landed (at once
  // where nothing runs in the background); throws the background's error if it failed.
  void wait_for_update(size_t index) const;
  // The same for every parameter.
  void wait_for_updates() const;
  // Runs on the thread that updates an offloaded parameter on the host, just before it, with
  // the parameter's index: tests make the host slow, or fail, through it.
  void set_before_host_update(std::function<void(size_t index)> hook);
  // Bytes of the host buffers that offload stages parameters and gradients in.
  int64_t staging_bytes() const;

  // State of parameter i in slot s (undefined until created), for sharded optimizers.
  const Tensor& state(size_t param, size_t slot) const;
  const std::vector<StateSlot>& slots() const { return slots_; }

 protected:
  // Updates `param` from grad (contiguous, same shape, dtype and device): params_[index], or
  // its host copy under offload. Runs under NoGradGuard.
  virtual void update(size_t index, const Tensor& param, const Tensor& grad) = 0;
  // The state tensor of (param, slot), created (zeros) on first use.
  Tensor& state_slot(size_t param, size_t slot);
  // Whether (param, slot) has state yet. update() asks this, not state(), which would wait
  // for the very update that asks.
  bool has_state(size_t param, size_t slot) const { return state_.at(param).at(slot).defined(); }
  // Short name for errors: "SGD", "AdamW".
  virtual const char* name() const = 0;

  double lr_;

 private:
  // Where the state of parameter p lives: beside it, or on the offload device; a counter of
  // a GPU parameter, which the host reads every step, in host memory.
  Device state_device(const Tensor& p, bool per_element) const;
  // Offload: copies gradient `grad` of parameter `index` into its host buffer (made on first
  // use, with the parameter's).
  void stage_gradient(size_t index, const Tensor& grad);
  // Offload: reads parameter `index` into its host buffer, updates it there from its staged
  // gradient and copies it back. Synchronous offload runs it inside step(), overlapped
  // offload on the worker.
  void update_staged(size_t index);
  // Called by ParameterReadGuard: whether a guard makes the parameters' readers wait.
  friend class ParameterReadGuard;
  void set_readers_wait(bool guarded);

  std::vector<Tensor> params_;
  std::vector<StateSlot> slots_;
  std::vector<std::vector<Tensor>> state_;  // [param][slot]
  int64_t step_count_ = 0;
  std::optional<Device> offload_;
  struct Staged {
    Tensor param, grad;
  };
  std::vector<Staged> staged_;  // offload: per parameter, its host buffers (created on first step)
  OffloadUpdates offload_updates_ = OffloadUpdates::synchronous;
  bool readers_wait_ = false;  // a ParameterReadGuard covers the parameters
  std::function<void(size_t)> before_host_update_;
  // Overlapped offload's worker, made when a guard first covers the parameters.
  std::unique_ptr<BackgroundUpdates> background_;
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
