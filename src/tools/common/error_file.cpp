#include "tools/common/error_file.h"

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

namespace lockstep::tools {

WorkerError read_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("message")) return {};
  const nlohmann::json& message = j["message"];
  WorkerError error;
  if (message.is_string()) {
    error.message = message.get<std::string>();
  } else if (message.is_object()) {
    error.message = message.value("message", "");
    if (message.contains("extraInfo") && message["extraInfo"].is_object()) {
      error.traceback = message["extraInfo"].value("py_callstack", "");
    }
  }
  return error;
}

void write_error_file(const std::string& message) noexcept {
  try {
    const char* path = std::getenv(kErrorFileVariable);
    if (path == nullptr || *path == '\0') return;
    const auto seconds =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    const nlohmann::json j = {
        {"message", {{"message", message}, {"extraInfo", {{"timestamp", std::to_string(seconds)}}}}}};
    std::ofstream(path) << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } catch (...) {
  }
}

}  // namespace lockstep::tools
