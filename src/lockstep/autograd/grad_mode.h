// Whether ops record autograd history on this thread. NoGradGuard turns recording off for
// a scope (evaluation, optimizer steps, backward itself), like torch.no_grad().
#pragma once

namespace lockstep {

class GradMode {
 public:
  static bool enabled();
  static void set_enabled(bool enabled);
};

class NoGradGuard {
 public:
  NoGradGuard() : previous_(GradMode::enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace lockstep
