#include "lockstep/optim/optimizer.h"

#include <sstream>

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/core/cuda_device.h"
#include "lockstep/core/parallel.h"
#include "lockstep/optim/optimizer_background_updates.h"

namespace lockstep::optim {
namespace {

constexpr const char* kStepKey = "step";

}  // namespace

std::string state_key(size_t index, const std::string& slot) {
  std::string key = "state.";
  key += std::to_string(index);
  key += '.';
  key += slot;
  return key;
}

bool parse_state_key(const std::string& key, size_t& index, std::string& slot) {
  const std::string prefix = "state.";
  if (key.rfind(prefix, 0) != 0) return false;
  const size_t dot = key.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size() || dot + 1 == key.size()) return false;
  const std::string digits = key.substr(prefix.size(), dot - prefix.size());
  if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  index = std::stoul(digits);
  slot = key.substr(dot + 1);
  return true;
}

Optimizer::Optimizer(std::vector<Tensor> params, double lr, std::vector<StateSlot> slots)
    : lr_(0), params_(std::move(params)), slots_(std::move(slots)) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    LOCKSTEP_CHECK(p.defined()) << "optimizer: parameter " << i << " is an undefined tensor";
    LOCKSTEP_CHECK(p.requires_grad() && p.is_leaf())
        << "optimizer: parameter " << i << " " << shape_str(p.shape())
        << " does not require grad (or is not a leaf); pass model.parameters()";
    LOCKSTEP_CHECK(p.dtype() == DType::f32 || p.dtype() == DType::f64)
        << "optimizer: parameter " << i << " is " << dtype_name(p.dtype()) << "; optimizers update f32 or f64 weights";
    LOCKSTEP_CHECK(p.is_contiguous()) << "optimizer: parameter " << i << " " << shape_str(p.shape())
                                      << " is not contiguous; register contiguous tensors as parameters";
    LOCKSTEP_CHECK(p.device().is_cpu() || (p.device().is_cuda() && lockstep::cuda::built()))
        << "optimizer: parameter " << i << " is on " << p.device()
        << ", and this build has no CUDA backend to update it there (built when nvcc and NCCL are found)";
    for (size_t j = 0; j < i; ++j)
      LOCKSTEP_CHECK(!params_[j].is_same(p))
          << "optimizer: parameter " << i << " is the same tensor as parameter " << j << "; pass each parameter once";
  }
  state_.assign(params_.size(), std::vector<Tensor>(slots_.size()));
  set_lr(lr);
}

Optimizer::~Optimizer() {
  // The worker calls update(), which the derived class's part of this object, gone by now,
  // implemented: a guard over this optimizer waits for it before then.
  if (background_) background_->wait_all_quietly();
}

bool Optimizer::overlaps_updates() const {
  return offload_ && offload_updates_ == OffloadUpdates::overlapped && readers_wait_;
}

void Optimizer::wait_for_update(size_t index) const {
  if (background_) background_->wait_until_landed(index);
}

void Optimizer::wait_for_updates() const {
  if (background_) background_->wait_all();
}

void Optimizer::set_readers_wait(bool guarded) {
  if (!guarded && background_) background_->wait_all_quietly();
  // Made here, before any step, rather than by the first overlapped step: other threads'
  // waits (DataParallel's devices wait for every device's optimizer) read background_.
  if (guarded && !background_)
    background_ = std::make_unique<BackgroundUpdates>(std::string(name()) + "'s offloaded update");
  readers_wait_ = guarded;
}

void Optimizer::set_before_host_update(std::function<void(size_t index)> hook) {
  wait_for_updates();
  before_host_update_ = std::move(hook);
}

const std::vector<Tensor>& Optimizer::params() const {
  wait_for_updates();
  return params_;
}

const Tensor& Optimizer::state(size_t param, size_t slot) const {
  wait_for_updates();
  return state_.at(param).at(slot);
}

Device Optimizer::state_device(const Tensor& p, bool per_element) const {
  if (offload_) return *offload_;
  // p's own CPU device, so memory_stats counts a CPU parameter's counter there.
  return per_element || !p.device().is_cuda() ? p.device() : Device::cpu();
}

void Optimizer::offload_to(Device host, OffloadUpdates updates) {
  LOCKSTEP_CHECK(host.is_cpu()) << name() << ": the optimizer state is offloaded to host memory, a CPU device; got "
                                << host;
  wait_for_updates();
  offload_ = host;
  offload_updates_ = updates;
  for (std::vector<Tensor>& slots : state_)
    for (Tensor& t : slots)
      if (t.defined() && t.device() != host) t = t.to(host);
  staged_.assign(params_.size(), Staged{});
}

int64_t Optimizer::staging_bytes() const {
  wait_for_updates();
  int64_t bytes = 0;
  for (const Staged& s : staged_)
    for (const Tensor* t : {&s.param, &s.grad})
      if (t->defined()) bytes += t->numel() * static_cast<int64_t>(dtype_size(t->dtype()));
  return bytes;
}

void Optimizer::stage_gradient(size_t index, const Tensor& grad) {
  Staged& staged = staged_.at(index);
  if (!staged.param.defined()) {
    const Tensor& param = params_[index];
    staged.param = Tensor::empty(param.shape(), param.dtype(), *offload_);
    staged.grad = Tensor::empty(grad.shape(), grad.dtype(), *offload_);
  }
  staged.grad.copy_from(grad);
}

void Optimizer::update_staged(size_t index) {
  if (before_host_update_) before_host_update_(index);
  const Staged& staged = staged_.at(index);
  const Tensor& param = params_[index];
  // The parameter is read back each step rather than kept as the truth on the host: a
  // program may write the weights between steps (a load, an average of replicas).
  staged.param.copy_from(param);
  update(index, staged.param, staged.grad);
  param.copy_from(staged.param);
}

void Optimizer::set_lr(double lr) {
  LOCKSTEP_CHECK(lr >= 0.0) << "optimizer: learning rate must be >= 0, got " << lr;
  wait_for_updates();  // the update in flight reads lr_
  lr_ = lr;
}

void Optimizer::step() {
  // The previous step's update has landed (its staging buffers are ours again), or its
  // error is thrown here.
  wait_for_updates();
  NoGradGuard no_grad;
  const bool overlapped = overlaps_updates();
  std::vector<size_t> queued;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    LOCKSTEP_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype() && g.device() == p.device())
        << name() << ": gradient of parameter " << i << " is " << shape_str(g.shape()) << " " << dtype_name(g.dtype())
        << " on " << g.device() << " but the parameter is " << shape_str(p.shape()) << " " << dtype_name(p.dtype())
        << " on " << p.device();
    if (!g.is_contiguous()) {
      Tensor dense = Tensor::empty(g.shape(), g.dtype(), g.device());
      dense.copy_from(g);
      g = dense;
    }
    if (offload_ && p.device() != *offload_) {
      // Copied now in both modes: the caller may reuse the gradient's memory once step()
      // returns (a layout's flat gradient buffer, filled again by the next backward).
      stage_gradient(i, g);
      if (overlapped) {
        queued.push_back(i);
      } else {
        update_staged(i);
      }
    } else {
      update(i, p, g);
    }
  }
  ++step_count_;
  if (queued.empty()) return;
  background_->start(
      std::move(queued), [this](size_t index) { update_staged(index); }, num_threads(), step_count_);
}

void Optimizer::zero_grad() {
  for (const Tensor& p : params_) p.set_grad(Tensor());
}

Tensor& Optimizer::state_slot(size_t param, size_t slot) {
  Tensor& t = state_.at(param).at(slot);
  if (!t.defined()) {
    const Tensor& p = params_[param];
    const bool per_element = slots_[slot].per_element;
    t = Tensor::zeros(per_element ? p.shape() : Shape{}, per_element ? p.dtype() : DType::i64,
                      state_device(p, per_element));
  }
  return t;
}

int64_t Optimizer::state_bytes() const {
  wait_for_updates();
  int64_t bytes = 0;
  for (const std::vector<Tensor>& slots : state_)
    for (const Tensor& t : slots)
      if (t.defined()) bytes += t.numel() * static_cast<int64_t>(dtype_size(t.dtype()));
  return bytes;
}

NamedTensors Optimizer::state_dict() const {
  wait_for_updates();
  NamedTensors out;
  out.emplace_back(kStepKey, Tensor::scalar(static_cast<double>(step_count_), DType::i64));
  for (size_t i = 0; i < params_.size(); ++i)
    for (size_t s = 0; s < slots_.size(); ++s)
      if (state_[i][s].defined()) out.emplace_back(state_key(i, slots_[s].name), state_[i][s]);
  return out;
}

void Optimizer::load_state_dict(const NamedTensors& state) {
  wait_for_updates();
  std::vector<std::vector<Tensor>> loaded(params_.size(), std::vector<Tensor>(slots_.size()));
  int64_t step_count = -1;
  std::ostringstream problems;
  for (const auto& [key, value] : state) {
    if (!value.defined()) {
      problems << "\n\t" << key << ": undefined tensor";
      continue;
    }
    if (key == kStepKey) {
      if (value.numel() != 1 || value.item() < 0) {
        problems << "\n\tstep: expected one non-negative count, got " << value;
      } else {
        step_count = static_cast<int64_t>(value.item());
      }
      continue;
    }
    size_t index = 0;
    std::string slot_name;
    if (!parse_state_key(key, index, slot_name)) {
      problems << "\n\tunexpected key \"" << key << "\" (expected \"step\" or \"state.<param>.<slot>\")";
      continue;
    }
    if (index >= params_.size()) {
      problems << "\n\t" << key << ": parameter " << index << " does not exist, this optimizer has " << params_.size();
      continue;
    }
    size_t slot = 0;
    while (slot < slots_.size() && slots_[slot].name != slot_name) ++slot;
    if (slot == slots_.size()) {
      problems << "\n\t" << key << ": " << name() << " keeps no state named '" << slot_name << "' (it keeps:";
      for (const auto& known : slots_) problems << " " << known.name;
      problems << ")";
      continue;
    }
    if (loaded[index][slot].defined()) {
      problems << "\n\t" << key << ": given twice";
      continue;
    }
    const Tensor& p = params_[index];
    const Shape expected = slots_[slot].per_element ? p.shape() : Shape{};
    if (value.shape() != expected) {
      problems << "\n\t" << key << ": shape " << shape_str(value.shape()) << " does not match " << shape_str(expected)
               << (slots_[slot].per_element ? " (the parameter's shape)" : "");
      continue;
    }
    Tensor copy = Tensor::empty(expected, slots_[slot].per_element ? p.dtype() : DType::i64,
                                state_device(p, slots_[slot].per_element));
    copy.copy_from(value);
    loaded[index][slot] = copy;
  }
  if (step_count < 0 && problems.str().find("\n\tstep:") == std::string::npos) problems << "\n\tmissing key \"step\"";
  LOCKSTEP_CHECK(problems.str().empty()) << "Error(s) in loading " << name() << " optimizer state:" << problems.str()
                                         << "\n\t(was the checkpoint saved by a " << name()
                                         << " over the same parameters, in the same order?)";
  state_ = std::move(loaded);
  step_count_ = step_count;
}

}  // namespace lockstep::optim
