#include "lockstep/optim/schedule.h"

#include <charconv>
#include <cmath>
#include <numbers>
#include <sstream>
#include <vector>

#include "lockstep/core/error.h"

namespace lockstep::optim {
namespace {

constexpr const char* kSyntax =
    "the syntax is constant | step:<step_size>[:<gamma>] | cosine[:warmup=<n>][:total=<n>][:min_lr=<x>], e.g. "
    "step:30:0.1 or cosine:warmup=100,total=5000";

std::vector<std::string> split(const std::string& text, const std::string& separators) {
  std::vector<std::string> parts(1);
  for (char c : text) {
    if (separators.find(c) != std::string::npos) {
      parts.emplace_back();
    } else {
      parts.back() += c;
    }
  }
  return parts;
}

int64_t parse_count(const std::string& schedule, const std::string& what, const std::string& text, int64_t min) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  LOCKSTEP_CHECK(error == std::errc() && end == text.data() + text.size() && value >= min)
      << "LR schedule '" << schedule << "': " << what << " '" << text << "' is not an integer >= " << min << "; "
      << kSyntax;
  return value;
}

double parse_number(const std::string& schedule, const std::string& what, const std::string& text) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  LOCKSTEP_CHECK(error == std::errc() && end == text.data() + text.size() && std::isfinite(value) && value >= 0)
      << "LR schedule '" << schedule << "': " << what << " '" << text << "' is not a non-negative number; " << kSyntax;
  return value;
}

}  // namespace

double Schedule::lr_at(double base_lr, int64_t step) const {
  LOCKSTEP_CHECK(step >= 0) << "LR schedule: step must be >= 0, got " << step;
  switch (kind) {
    case Kind::constant:
      return base_lr;
    case Kind::step:
      return base_lr * std::pow(gamma, static_cast<double>(step / step_size));
    case Kind::cosine: {
      if (step < warmup_steps) return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
      LOCKSTEP_CHECK(total_steps > 0) << "LR schedule " << str()
                                      << ": total_steps is not set; call with_total_steps(run length) first";
      if (step >= total_steps) return min_lr;
      const double progress =
          static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
      return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    }
  }
  return base_lr;
}

Schedule Schedule::with_total_steps(int64_t total) const {
  Schedule out = *this;
  if (out.kind == Kind::cosine && out.total_steps == 0) {
    LOCKSTEP_CHECK(total > out.warmup_steps) << "LR schedule " << str() << ": the run's " << total
                                             << " steps do not outlast the " << out.warmup_steps << " warmup steps";
    out.total_steps = total;
  }
  return out;
}

std::string Schedule::str() const {
  std::ostringstream out;
  switch (kind) {
    case Kind::constant:
      out << "constant";
      break;
    case Kind::step:
      out << "step:" << step_size << ":" << gamma;
      break;
    case Kind::cosine:
      out << "cosine:warmup=" << warmup_steps << ",total=" << total_steps << ",min_lr=" << min_lr;
      break;
  }
  return out.str();
}

Schedule parse_schedule(const std::string& text) {
  Schedule s;
  const size_t colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  const std::string rest = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (kind == "constant") {
    LOCKSTEP_CHECK(colon == std::string::npos)
        << "LR schedule '" << text << "': constant takes no options ('" << rest << "'); " << kSyntax;
    s.kind = Schedule::Kind::constant;
  } else if (kind == "step") {
    const auto parts = split(rest, ":");
    LOCKSTEP_CHECK(colon != std::string::npos && parts.size() <= 2)
        << "LR schedule '" << text << "': step needs a step size and an optional gamma; " << kSyntax;
    s.kind = Schedule::Kind::step;
    s.step_size = parse_count(text, "step size", parts[0], 1);
    if (parts.size() == 2) s.gamma = parse_number(text, "gamma", parts[1]);
  } else if (kind == "cosine") {
    s.kind = Schedule::Kind::cosine;
    if (colon != std::string::npos) {
      for (const std::string& option : split(rest, ":,")) {
        const size_t eq = option.find('=');
        const std::string key = option.substr(0, eq);
        const std::string value = eq == std::string::npos ? "" : option.substr(eq + 1);
        LOCKSTEP_CHECK(eq != std::string::npos && (key == "warmup" || key == "total" || key == "min_lr"))
            << "LR schedule '" << text << "': unknown cosine option '" << option
            << "' (expected warmup=<n>, total=<n> or min_lr=<x>); " << kSyntax;
        if (key == "warmup") s.warmup_steps = parse_count(text, "warmup", value, 0);
        if (key == "total") s.total_steps = parse_count(text, "total", value, 1);
        if (key == "min_lr") s.min_lr = parse_number(text, "min_lr", value);
      }
    }
    LOCKSTEP_CHECK(s.total_steps == 0 || s.total_steps > s.warmup_steps)
        << "LR schedule '" << text << "': total (" << s.total_steps << ") must exceed warmup (" << s.warmup_steps
        << ")";
  } else {
    LOCKSTEP_FAIL() << "unknown LR schedule '" << text << "': " << kSyntax;
  }
  return s;
}

}  // namespace lockstep::optim
