// Learning-rate schedules as pure functions of the step, so a resumed run needs only the
// step count to continue with the same rates. The CLI spells them:
//   constant
//   step:<step_size>[:<gamma>]                       lr · gamma^floor(step / step_size), gamma 0.1
//   cosine[:warmup=<n>][:total=<n>][:min_lr=<x>]     linear warmup, then cosine decay to min_lr
// (the cosine options may also be separated by ','). "step" is the number of optimizer steps
// taken before this one: 0 for the first.
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::optim {

struct Schedule {
  enum class Kind { constant, step, cosine };
  Kind kind = Kind::constant;
  // step: multiply by gamma every step_size steps (torch.optim.lr_scheduler.StepLR).
  int64_t step_size = 1;
  double gamma = 0.1;
  // cosine: lr · (step + 1) / warmup_steps during the first warmup_steps steps, then
  // min_lr + (lr - min_lr) · (1 + cos(π · t)) / 2 with t = (step - warmup) / (total - warmup),
  // and min_lr from total_steps on. total_steps 0 means "the run's length", filled in by
  // with_total_steps.
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double min_lr = 0.0;

  // The learning rate for `step` given the base (peak) rate.
  double lr_at(double base_lr, int64_t step) const;
  // A copy whose total_steps is `total` when it was left 0 (a cosine parsed without total=).
  Schedule with_total_steps(int64_t total) const;
  // The CLI spelling, e.g. "cosine:warmup=100,total=1000,min_lr=0".
  std::string str() const;
};

// Parses the syntax above; an Error names the bad text and shows the syntax.
Schedule parse_schedule(const std::string& text);

}  // namespace lockstep::optim
