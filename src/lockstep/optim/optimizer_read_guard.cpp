#include "lockstep/optim/optimizer_read_guard.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace lockstep::optim {
namespace {

// The bytes a tensor's elements span in its memory: addresses rather than storages, so
// views of one copy of the weights made any way (DataParallel's shares, replicas that
// share replica 0's bytes through aliases on their own devices) are seen to overlap.
struct Extent {
  Device device;
  uintptr_t begin = 0, end = 0;
};

Extent extent_of(const Tensor& t) {
  Extent extent{t.device()};
  if (t.numel() == 0) return extent;
  int64_t last = 0;  // the offset of the last element, in elements
  for (int64_t d = 0; d < t.dim(); ++d)
    last += (t.shape()[static_cast<size_t>(d)] - 1) * std::abs(t.strides()[static_cast<size_t>(d)]);
  extent.begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  extent.end = extent.begin + static_cast<uintptr_t>(last + 1) * dtype_size(t.dtype());
  return extent;
}

// same_memory: every CPU device is a part of the one host memory (an alias on cpu:1 of
// bytes on cpu:0 is the same bytes); a GPU's memory is its own.
bool overlap(const Extent& a, const Extent& b) {
  return same_memory(a.device, b.device) && a.begin < b.end && b.begin < a.end;
}

}  // namespace

ParameterReadGuard::ParameterReadGuard(const std::vector<nn::Module*>& models,
                                       const std::vector<Optimizer*>& optimizers) {
  std::vector<Extent> model_parameters;
  for (nn::Module* model : models) {
    for (const auto& [name, module] : model->named_modules()) {
      LOCKSTEP_CHECK(!module->has_parameter_access_hook())
          << "ParameterReadGuard: module '" << (name.empty() ? module->type_name() : name)
          << "' already waits for another guard's optimizers: give every optimizer that updates a model's "
             "parameters to one guard";
      modules_.push_back(module);
      for (const auto& [own_name, p] : module->own_parameters()) model_parameters.push_back(extent_of(p));
    }
  }
  // An optimizer steps in the background only if every parameter it writes is a model's,
  // whose readers wait: a tensor outside the models has no one to make its readers wait.
  std::vector<std::vector<Extent>> optimizer_parameters;
  for (Optimizer* optimizer : optimizers) {
    if (!optimizer->offload_device() || optimizer->offload_updates_ != OffloadUpdates::overlapped) continue;
    std::vector<Extent> extents;
    for (const Tensor& p : optimizer->params()) extents.push_back(extent_of(p));
    const bool inside = std::all_of(extents.begin(), extents.end(), [&](const Extent& e) {
      return e.begin == e.end || std::any_of(model_parameters.begin(), model_parameters.end(),
                                             [&](const Extent& m) { return overlap(e, m); });
    });
    if (!inside) continue;
    overlapped_.push_back(optimizer);
    optimizer_parameters.push_back(std::move(extents));
  }
  if (overlapped_.empty()) {
    modules_.clear();
    return;
  }
  for (nn::Module* module : modules_) {
    std::vector<Landing> landings;
    for (size_t o = 0; o < overlapped_.size(); ++o) {
      const std::vector<Extent>& extents = optimizer_parameters[o];
      for (size_t i = extents.size(); i-- > 0;) {
        const bool read = std::any_of(module->own_parameters().begin(), module->own_parameters().end(),
                                      [&](const auto& own) { return overlap(extents[i], extent_of(own.second)); });
        if (!read) continue;
        landings.push_back({overlapped_[o], i});
        break;
      }
    }
    module->set_parameter_access_hook([this, landings = std::move(landings)](bool whole) {
      if (whole) return wait_for_all();
      for (const Landing& landing : landings) landing.optimizer->wait_for_update(landing.last_index);
    });
  }
  for (Optimizer* optimizer : overlapped_) optimizer->set_readers_wait(true);
}

ParameterReadGuard::~ParameterReadGuard() {
  for (Optimizer* optimizer : overlapped_) optimizer->set_readers_wait(false);  // waits, quietly
  for (nn::Module* module : modules_) module->set_parameter_access_hook(nullptr);
}

void ParameterReadGuard::wait_for_all() const {
  for (Optimizer* optimizer : overlapped_) optimizer->wait_for_updates();
}

}  // namespace lockstep::optim
