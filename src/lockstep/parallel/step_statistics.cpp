#include "lockstep/parallel/step_statistics.h"

namespace lockstep::parallel {

StepStatistics::StepStatistics(nn::Module& model) {
  model.defer_step_statistics(true);
  for (const auto& [name, module] : model.named_modules()) modules_.push_back(module);
}

std::vector<Tensor> StepStatistics::take() {
  std::vector<Tensor> entries;
  std::vector<size_t> counts;
  for (nn::Module* module : modules_) {
    std::vector<Tensor> own = module->take_step_statistics();
    counts.push_back(own.size());
    // The tree adds into its leaves: a copy, so no module's pending sum is folded into.
    for (const Tensor& t : own) entries.push_back(t.clone());
  }
  if (!counted_) {
    counts_ = std::move(counts);
    counted_ = true;
  } else {
    LOCKSTEP_CHECK(counts == counts_) << "a module's take_step_statistics() changed how many tensors it returns; "
                                         "it must return the same entries every time";
  }
  return entries;
}

void StepStatistics::apply(const std::vector<Tensor>& sums) {
  LOCKSTEP_CHECK(counted_) << "StepStatistics::apply before any take()";
  size_t next = 0;
  for (size_t m = 0; m < modules_.size(); ++m) {
    if (counts_[m] == 0) continue;
    const std::vector<Tensor> own(sums.begin() + static_cast<std::ptrdiff_t>(next),
                                  sums.begin() + static_cast<std::ptrdiff_t>(next + counts_[m]));
    modules_[m]->apply_step_statistics(own);
    next += counts_[m];
  }
  LOCKSTEP_CHECK(next == sums.size()) << "StepStatistics::apply got " << sums.size() << " entries for " << next;
}

}  // namespace lockstep::parallel
