// A small command-line parser: each subcommand binds its options to variables, then
// parse() fills them from "--name value" / "--name=value" / "--switch". Unknown flags and
// bad values are UsageErrors (exit code 2) that name the flag and the accepted form.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace lockstep::tools {

class Flags {
 public:
  // command: how the user runs it, e.g. "lockstep train" (usage and errors show it).
  Flags(std::string command, std::string summary) : command_(std::move(command)), summary_(std::move(summary)) {}

  void add(const std::string& name, std::string* target, const std::string& help);
  void add(const std::string& name, int64_t* target, const std::string& help);
  void add(const std::string& name, uint64_t* target, const std::string& help);
  void add(const std::string& name, double* target, const std::string& help);
  // An integer flag that also takes one word in place of a number (--micro-batch auto): the
  // word sets *chose_word and leaves *target as it was.
  void add(const std::string& name, int64_t* target, const std::string& word, bool* chose_word,
           const std::string& help);
  void add_switch(const std::string& name, bool* target, const std::string& help);

  // Returns false when --help was given (usage printed to stdout); throws UsageError.
  bool parse(const std::vector<std::string>& args);
  // Whether the flag was given on the command line.
  bool given(const std::string& name) const;
  std::string usage() const;

 private:
  struct Option {
    std::string name;
    std::variant<std::string*, int64_t*, uint64_t*, double*, bool*> target;
    std::string help;
    std::string default_text;
    std::string word = "";  // an integer flag's one word, if it takes one
    bool* chose_word = nullptr;
  };
  const Option* find(const std::string& name) const;
  void set(const Option& option, const std::string& value) const;

  std::string command_, summary_;
  std::vector<Option> options_;
  std::vector<std::string> given_;
};

// A flag's number as a user would type it back ("0.5", "-1", "1e-05"), for messages.
std::string flag_number(double value);

}  // namespace lockstep::tools
