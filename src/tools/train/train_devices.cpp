#include "tools/train/train_devices.h"

#include <sstream>
#include <vector>

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

const char* kForms = "a count (--devices 4), a kind (cpu or cuda: all of them) or a list from index 0 (cuda:0,cuda:1)";

int parse_count(const std::string& text) {
  size_t used = 0;
  int value = -1;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || value < 1) {
    throw UsageError("--devices " + text + " is not " + kForms);
  }
  return value;
}

std::string gpu_range(int visible_gpus) {
  if (visible_gpus == 0) return "no GPU is visible to this process (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
  return "this process sees cuda:0 to cuda:" + std::to_string(visible_gpus - 1);
}

}  // namespace

DeviceChoice parse_devices(const std::string& text, int visible_gpus) {
  const DeviceType auto_type = visible_gpus > 0 ? DeviceType::cuda : DeviceType::cpu;
  if (text.empty()) return {auto_type, 0};
  if (text == "cpu") return {DeviceType::cpu, 0};
  if (text == "cuda" || text == "gpu") {
    if (visible_gpus == 0) throw UsageError("--devices " + text + ": " + gpu_range(visible_gpus));
    return {DeviceType::cuda, 0};
  }
  if (text.find(':') == std::string::npos) {
    const int count = parse_count(text);
    // CPU devices may outnumber the cores (they share them); a GPU device is a whole GPU.
    if (auto_type == DeviceType::cuda && count > visible_gpus) {
      throw UsageError("--devices " + text + " asks for more GPUs than there are: " + gpu_range(visible_gpus) +
                       " (use --devices cpu for CPU devices)");
    }
    return {auto_type, count};
  }

  std::vector<Device> list;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    try {
      list.push_back(Device::parse(item));
    } catch (const Error&) {
      throw UsageError("--devices " + text + ": '" + item + "' is not a device; expected " + kForms);
    }
  }
  if (list.empty()) throw UsageError("--devices " + text + " names no device; expected " + kForms);
  for (size_t i = 0; i < list.size(); ++i) {
    const Device expected(list.front().type(), static_cast<int>(i));
    if (list[i] != expected) {
      std::string hint;
      if (list.front().is_cuda()) {
        hint =
            "; to train on other GPUs, make them visible as cuda:0, cuda:1, ... with CUDA_VISIBLE_DEVICES (e.g. "
            "CUDA_VISIBLE_DEVICES=2,3 lockstep train --devices cuda:0,cuda:1)";
      }
      throw UsageError("--devices " + text + ": devices are named from index 0 in order, so entry " +
                       std::to_string(i) + " must be " + expected.str() + ", not " + list[i].str() + hint);
    }
  }
  if (list.front().is_cuda() && static_cast<int>(list.size()) > visible_gpus) {
    throw UsageError("--devices " + text + ": " + list.back().str() + " does not exist; " + gpu_range(visible_gpus));
  }
  return {list.front().type(), static_cast<int>(list.size())};
}

}  // namespace lockstep::tools
