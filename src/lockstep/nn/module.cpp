#include "lockstep/nn/module.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <unordered_map>

#include "lockstep/autograd/grad_mode.h"

namespace lockstep::nn {
namespace {

constexpr const char* kDdpPrefix = "module.";

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

std::string join_quoted(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", \"" : "\"") + names[i] + "\"";
  return out;
}

}  // namespace

Tensor Module::forward(const Tensor&) {
  LOCKSTEP_FAIL() << type_name_ << " has no forward(): it is a container; call its children, or override forward()";
  return Tensor();
}

Tensor Module::operator()(const Tensor& x) {
  if (before_parameter_access_) before_parameter_access_(false);
  if (before_forward_) before_forward_();
  const Tensor y = forward(x);
  return after_forward_ ? after_forward_(y) : y;
}

void Module::set_forward_hooks(ForwardPreHook before, ForwardHook after) {
  before_forward_ = std::move(before);
  after_forward_ = std::move(after);
}

void Module::set_parameter_access_hook(ParameterAccessHook hook) { before_parameter_access_ = std::move(hook); }

void Module::check_new_name(const std::string& name, const char* what) const {
  LOCKSTEP_CHECK(!name.empty() && name.find('.') == std::string::npos)
      << type_name_ << ": " << what << " name '" << name << "' must be non-empty and contain no '.'";
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& entry) { return entry.first == name; });
  };
  LOCKSTEP_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_))
      << type_name_ << ": cannot register " << what << " '" << name
      << "': that name is already a parameter, buffer or child of this module";
}

Tensor Module::register_parameter(const std::string& name, Tensor tensor) {
  check_new_name(name, "parameter");
  LOCKSTEP_CHECK(tensor.defined()) << type_name_ << ": parameter '" << name << "' is an undefined tensor";
  LOCKSTEP_CHECK(tensor.is_leaf()) << type_name_ << ": parameter '" << name
                                   << "' was computed by an op; register a leaf (use detach())";
  tensor.set_requires_grad(true);
  parameters_.emplace_back(name, tensor);
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, Tensor tensor) {
  check_new_name(name, "buffer");
  LOCKSTEP_CHECK(tensor.defined()) << type_name_ << ": buffer '" << name << "' is an undefined tensor";
  buffers_.emplace_back(name, tensor);
  return tensor;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "module");
  LOCKSTEP_CHECK(module != nullptr) << type_name_ << ": child module '" << name << "' is null";
  children_.emplace_back(name, std::move(module));
}

void Module::collect_parameters(const std::string& prefix, NamedTensors& out,
                                std::vector<const TensorImpl*>& seen) const {
  for (const auto& [name, tensor] : parameters_) {
    const TensorImpl* impl = tensor.impl();
    if (std::find(seen.begin(), seen.end(), impl) != seen.end()) continue;
    seen.push_back(impl);
    out.emplace_back(prefix + name, tensor);
  }
  for (const auto& [name, child] : children_) child->collect_parameters(prefix + name + ".", out, seen);
}

NamedTensors Module::named_parameters() const {
  if (before_parameter_access_) before_parameter_access_(true);
  return named_parameters_unwaited();
}

NamedTensors Module::named_parameters_unwaited() const {
  NamedTensors out;
  std::vector<const TensorImpl*> seen;
  collect_parameters("", out, seen);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& entry : named_parameters()) out.push_back(std::move(entry.second));
  return out;
}

void Module::collect_buffers(const std::string& prefix, NamedTensors& out) const {
  for (const auto& [name, tensor] : buffers_) out.emplace_back(prefix + name, tensor);
  for (const auto& [name, child] : children_) child->collect_buffers(prefix + name + ".", out);
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect_buffers("", out);
  return out;
}

void Module::collect_modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out) {
  out.emplace_back(prefix, this);
  for (const auto& [name, child] : children_) child->collect_modules(prefix.empty() ? name : prefix + "." + name, out);
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  collect_modules("", out);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t total = 0;
  for (const auto& entry : named_parameters_unwaited()) total += entry.second.numel();
  return total;
}

void Module::collect_state(const std::string& prefix, NamedTensors& out) const {
  for (const auto& [name, tensor] : parameters_) out.emplace_back(prefix + name, tensor.detach());
  for (const auto& [name, tensor] : buffers_) out.emplace_back(prefix + name, tensor.detach());
  for (const auto& [name, child] : children_) child->collect_state(prefix + name + ".", out);
}

NamedTensors Module::state_dict() const {
  if (before_parameter_access_) before_parameter_access_(true);
  NamedTensors out;
  collect_state("", out);
  return out;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  const NamedTensors expected = state_dict();
  auto all_prefixed = [](const NamedTensors& list) {
    return !list.empty() && std::all_of(list.begin(), list.end(),
                                        [](const auto& entry) { return starts_with(entry.first, kDdpPrefix); });
  };
  // A model whose own names all start with "module." (it wraps a child called "module")
  // takes keys as they are.
  const size_t strip = all_prefixed(state) && !all_prefixed(expected) ? std::string(kDdpPrefix).size() : 0;

  std::unordered_map<std::string, size_t> index_of;
  for (size_t i = 0; i < expected.size(); ++i) index_of.emplace(expected[i].first, i);
  std::vector<const Tensor*> source(expected.size(), nullptr);
  std::vector<bool> named(expected.size(), false);  // the state has the key (usable or not)
  std::vector<std::string> unexpected, duplicated, missing;
  std::ostringstream mismatches;
  for (const auto& [key, value] : state) {
    const auto it = index_of.find(key.substr(strip));
    if (it == index_of.end()) {
      unexpected.push_back(key);
      continue;
    }
    const Tensor& target = expected[it->second].second;
    const bool repeated = named[it->second];
    named[it->second] = true;
    if (repeated) {
      duplicated.push_back(key);
    } else if (!value.defined()) {
      mismatches << "\n\tundefined tensor for " << key;
    } else if (value.shape() != target.shape()) {
      mismatches << "\n\tsize mismatch for " << key << ": copying a param with shape " << shape_str(value.shape())
                 << " from checkpoint, the shape in current model is " << shape_str(target.shape()) << ".";
    } else {
      source[it->second] = &value;
    }
  }
  for (size_t i = 0; i < expected.size(); ++i)
    if (!named[i]) missing.push_back(expected[i].first);

  std::ostringstream message;
  if (strict && !missing.empty()) message << "\n\tMissing key(s) in state_dict: " << join_quoted(missing) << ".";
  // Every unexpected key is a missing one under a prefix (PyTorch's DDP saves "module.",
  // Lockstep's checkpoints "model."): say so.
  if (strict && !unexpected.empty() && unexpected.size() == missing.size()) {
    const std::string& first = unexpected.front();
    for (const std::string& wanted : missing) {
      if (first.size() <= wanted.size() || first.compare(first.size() - wanted.size(), wanted.size(), wanted) != 0)
        continue;
      const std::string prefix = first.substr(0, first.size() - wanted.size());
      const std::set<std::string> extra(unexpected.begin(), unexpected.end());
      const bool all =
          std::all_of(missing.begin(), missing.end(), [&](const std::string& m) { return extra.contains(prefix + m); });
      if (all)
        message << "\n\tThe state_dict's names have the prefix '" << prefix << "' that this model's lack: remove it.";
      break;
    }
  }
  if (strict && !unexpected.empty())
    message << "\n\tUnexpected key(s) in state_dict: " << join_quoted(unexpected) << ".";
  if (!duplicated.empty()) message << "\n\tDuplicate key(s) in state_dict: " << join_quoted(duplicated) << ".";
  message << mismatches.str();
  LOCKSTEP_CHECK(message.str().empty())
      << "Error(s) in loading state_dict for " << type_name_ << ":" << message.str()
      << (strict && (!missing.empty() || !unexpected.empty())
              ? "\n\t(check that the checkpoint is for this model; load_state_dict(state, /*strict=*/false) loads "
                "the keys that match and ignores the rest)"
              : "");

  NoGradGuard no_grad;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (source[i] == nullptr) continue;
    const Tensor& target = expected[i].second;
    // Loading a model's own state_dict into itself, or into a replica that shares its
    // weights: the bytes are already there.
    // (data_ptr: a GPU model's tensors have no host address to compare.)
    const bool same_bytes = source[i]->device() == target.device() && source[i]->data_ptr() == target.data_ptr() &&
                            source[i]->strides() == target.strides() && source[i]->dtype() == target.dtype();
    if (!same_bytes) target.copy_from(*source[i]);
  }
}

void Module::train(bool on) {
  training_ = on;
  for (const auto& entry : children_) entry.second->train(on);
}

void Module::defer_step_statistics(bool on) {
  defer_statistics_ = on;
  for (const auto& entry : children_) entry.second->defer_step_statistics(on);
}

void Module::to(Device device) {
  for (const auto& [name, p] : named_parameters()) p.set_data(p.to(device));
  for (const auto& [name, buffer] : named_buffers()) buffer.set_data(buffer.to(device));
}

void Module::zero_grad() {
  for (const auto& entry : named_parameters_unwaited()) entry.second.set_grad(Tensor());
}

void Module::set_forward_context(const ForwardContext& context) {
  int64_t next_random = 0;
  for (const auto& entry : named_modules()) {
    Module& module = *entry.second;
    module.context_ = context;
    module.has_context_ = true;
    module.random_layer_index_ = module.uses_randomness() ? next_random++ : -1;
  }
}

void Module::reset_parameter(const std::string& name, const Tensor&, Philox&) {
  LOCKSTEP_FAIL() << type_name_ << " does not know how to initialize its parameter '" << name
                  << "': override Module::reset_parameter for it";
}

}  // namespace lockstep::nn
