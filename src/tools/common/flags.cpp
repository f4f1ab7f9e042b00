#include "tools/common/flags.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

template <typename T>
std::string text_of(const T& value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

[[noreturn]] void usage_error(const std::string& message) { throw UsageError(message); }

}  // namespace

void Flags::add(const std::string& name, std::string* target, const std::string& help) {
  options_.push_back({name, target, help, target->empty() ? "" : *target});
}
void Flags::add(const std::string& name, int64_t* target, const std::string& help) {
  options_.push_back({name, target, help, text_of(*target)});
}
void Flags::add(const std::string& name, int64_t* target, const std::string& word, bool* chose_word,
                const std::string& help) {
  options_.push_back({name, target, help, text_of(*target), word, chose_word});
}
void Flags::add(const std::string& name, uint64_t* target, const std::string& help) {
  options_.push_back({name, target, help, text_of(*target)});
}
void Flags::add(const std::string& name, double* target, const std::string& help) {
  options_.push_back({name, target, help, text_of(*target)});
}
void Flags::add_switch(const std::string& name, bool* target, const std::string& help) {
  options_.push_back({name, target, help, ""});
}

const Flags::Option* Flags::find(const std::string& name) const {
  for (const Option& option : options_)
    if (option.name == name) return &option;
  return nullptr;
}

void Flags::set(const Option& option, const std::string& value) const {
  if (option.chose_word != nullptr && value == option.word) {
    *option.chose_word = true;
    return;
  }
  const auto bad = [&](const char* expected) {
    usage_error("--" + option.name + " expects " + expected + (option.word.empty() ? "" : " or " + option.word) +
                ", got '" + value + "'");
  };
  std::visit(
      [&](auto* target) {
        using T = std::remove_pointer_t<decltype(target)>;
        if constexpr (std::is_same_v<T, std::string>) {
          *target = value;
        } else if constexpr (std::is_same_v<T, bool>) {
          *target = true;
        } else {
          std::istringstream in(value);
          T parsed{};
          if (value.empty() || (std::is_unsigned_v<T> && value[0] == '-') || !(in >> parsed) || !in.eof()) {
            bad(std::is_floating_point_v<T> ? "a number"
                : std::is_unsigned_v<T>     ? "a non-negative integer"
                                            : "an integer");
          }
          *target = parsed;
        }
      },
      option.target);
}

bool Flags::parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage().c_str(), stdout);
      return false;
    }
    if (arg.rfind("--", 0) != 0) usage_error("unexpected argument '" + arg + "' (options start with --; see --help)");
    std::string name = arg.substr(2), value;
    const auto eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const Option* option = find(name);
    if (option == nullptr) usage_error("unknown option --" + name + " (see '" + command_ + " --help')");
    if (std::holds_alternative<bool*>(option->target)) {
      if (inline_value) usage_error("--" + name + " takes no value");
    } else if (!inline_value) {
      if (i + 1 >= args.size()) usage_error("--" + name + " needs a value");
      value = args[++i];
    }
    set(*option, value);
    given_.push_back(name);
  }
  return true;
}

bool Flags::given(const std::string& name) const {
  return std::find(given_.begin(), given_.end(), name) != given_.end();
}

std::string Flags::usage() const {
  std::ostringstream out;
  out << "usage: " << command_ << " [options]\n\n" << summary_ << "\n\noptions:\n";
  for (const Option& option : options_) {
    std::string left = "  --" + option.name;
    if (!std::holds_alternative<bool*>(option.target)) left += " VALUE";
    out << left << std::string(left.size() < 26 ? 26 - left.size() : 1, ' ') << option.help;
    // Help that explains its own default (a computed one) is not followed by the raw value.
    if (!option.default_text.empty() && option.help.find("(default") == std::string::npos)
      out << " (default " << option.default_text << ")";
    out << "\n";
  }
  return out.str();
}

std::string flag_number(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

}  // namespace lockstep::tools
