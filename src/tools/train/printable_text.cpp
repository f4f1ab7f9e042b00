#include "tools/train/printable_text.h"

#include <nlohmann/json.hpp>

namespace lockstep::tools {

std::string printable_text(const std::string& bytes) {
  // nlohmann's UTF-8 check replaces each broken sequence with U+FFFD.
  const std::string quoted = nlohmann::json(bytes).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const std::string text = nlohmann::json::parse(quoted).get<std::string>();
  static const std::string kReplacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const bool c0 = c < 0x20 && c != '\n' && c != '\t';
    const bool c1 = c == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9F;  // U+0080..U+009F
    if (c0 || c == 0x7F) {
      out += kReplacement;
    } else if (c1) {
      out += kReplacement;
      ++i;
    } else {
      out += text[i];
    }
  }
  return out;
}

}  // namespace lockstep::tools
