#include "tools/train/state_mismatch.h"

#include <map>
#include <vector>

#include "lockstep/core/shape.h"

namespace lockstep::tools {
namespace {

constexpr size_t kNamed = 3;  // of each kind

std::string some_of(const std::vector<std::string>& items) {
  std::string text;
  for (size_t i = 0; i < items.size() && i < kNamed; ++i) text += (i ? ", " : "") + items[i];
  if (items.size() > kNamed) text += ", ...";
  return text;
}

}  // namespace

std::string describe_state_mismatch(const NamedTensors& file, const NamedTensors& model) {
  std::map<std::string, const Tensor*> in_file;
  for (const auto& [name, tensor] : file) in_file[name] = &tensor;
  std::vector<std::string> missing, reshaped, extra;
  std::map<std::string, bool> in_model;
  for (const auto& [name, tensor] : model) {
    in_model[name] = true;
    const auto it = in_file.find(name);
    if (it == in_file.end()) {
      missing.push_back(name);
    } else if (it->second->shape() != tensor.shape()) {
      reshaped.push_back(name + " " + shape_str(it->second->shape()) + " in the file, " + shape_str(tensor.shape()) +
                         " here");
    }
  }
  for (const auto& [name, tensor] : file) {
    if (!in_model.contains(name)) extra.push_back(name);
  }
  std::string text;
  const auto add = [&](const std::vector<std::string>& items, const std::string& what) {
    if (items.empty()) return;
    text += (text.empty() ? "" : ", ") + std::to_string(items.size()) + " " + what + " (" + some_of(items) + ")";
  };
  add(missing, "missing");
  add(extra, "not in the model");
  add(reshaped, "of another shape");
  return text;
}

}  // namespace lockstep::tools
